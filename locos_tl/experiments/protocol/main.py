"""The paper's protocol on a real pretrained LLM: one resumable command.

Stages (each writes under ``--out`` and is skipped or resumed when rerun):

1. ``trials``: detection and evaluation trials from the shipped ``everyday`` needle set
   (``--needle-set``; ``--detect-needle-set`` and ``--eval-needle-set`` take each side
   from a set of its own, e.g. ``hop_detect`` and ``hop_eval``), kept disjoint:
   detection uses ``--detect-haystack`` (default: the prose haystack
   shipped with locos_tl, which names no people; ``dracula`` for a shipped book), the
   even-indexed names of every entry's character set and seed 101; evaluation uses
   *The Last of the Mohicans* (both parts), the odd-indexed names and seed 202. NIAH
   trials (the Wu et al. probes) on the detection haystack for "Wu on NIAH". Parametric
   and arithmetic control trials (the specificity controls).
2. ``detect``: LOCOS, Wu, attention-spatial, HeadKV and DLA in one decode pass over the
   non-literal (``onehop``) detection trials; Wu again on NIAH, whose answers are
   sentences (``--niah-max-new-tokens``, 50; the other trials' answer is a name, 16).
   ``--methods ...,atp,qrhead`` also scores attribution patching and QRHead there, with
   their own forward passes, and ablates their rankings.
3. ``calibrate``: query means of every head over 50 raw-text prompts (the paper's
   ``query_mean`` ablation), cut from the evaluation books.
4. ``ablate``: top-k of every ranking, random heads (3 seeds) and bottom-k, on ``onehop``
   and ``direct`` evaluation trials (ROUGE-L F and NoLiMa's ``contains``, with bootstrap
   95 % intervals over trials) and on the controls (exact match); DS(k).
   ``--methods baseline`` generates the unablated answers only (no ranking, random or
   bottom-k): whether the model retrieves at a new length or question type at all,
   before a sweep there.
5. ``patch``: CRI activation patching on a subset of detection trials; rank agreement
   with LOCOS (Spearman, Kendall, top-k overlap).
6. ``compress``: KV-cache compression sweep under LOCOS, Wu, HeadKV, uniform and random.
7. ``report``: ``summary.json``, the headline table (``headline.csv``, per question type
   and length; random is the mean over seeds, its interval a bootstrap over trials of
   each trial's mean over seeds), the layer distribution of the top heads and the
   figures (HTML + PNG when kaleido is present). The ablation tables
   (``ablate/*/evaluation_ci.csv``) are rebuilt from every finished generation of the
   grid the report is given, so sweeps run on different grids (say the non-literal
   questions at fewer k, or 2000 tokens at one k) report together; a job with a missing
   trial is left out.

Sizes: ``--preset`` ``full`` is the paper's protocol (>= 60 evaluation trials a question
type; meant for a GPU); ``cpu`` is the reduced size this repository's committed results
were measured at on a 2-core CPU (printed in ``summary.json``). Every option can be set
alone. Nothing is tuned on the evaluation trials: needles, seeds and k are fixed here.

Growing a run: the evaluation samples nest (the 20 trials of ``--n-eval 20`` are among
the 40 of ``--n-eval 40``), the trials stage rebuilds its files when a size option
changes, and the ablation and patching stages extend their run directories
(``evaluate(..., extend=True)``, ``patch_heads(..., extend=True)``), so a larger
``--n-eval``, ``--n-cri`` or ``--n-compress`` (or a new ``--fractions`` entry) runs
only the new trials. Other size changes are refused (``TRIAL_OPTIONS``). ``--workers N``
spreads the ablated generations over N Ray actors (identical results).

Usage::

    locos reproduce --model smollm2-135m-instruct --out runs/real/smollm2
    locos reproduce --model gemma-3-270m --template completion --ks 1,5,10,20 \\
        --out runs/real/gemma3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from locos_tl.experiments.protocol import common as util
from locos_tl.experiments.protocol.causal import compress, patch
from locos_tl.experiments.protocol.common import PRESETS, RANKINGS, STAGES, WU_NIAH
from locos_tl.experiments.protocol.report import report, resume_from
from locos_tl.experiments.protocol.stages import (
    _trial_sizes,
    _trials_changed,
    ablate,
    build_trials,
    calibrate,
    detect,
    load_rankings,
)

#: ``--methods``' help, from the registry (:data:`~locos_tl.experiments.protocol.common.RANKINGS`)
METHODS_HELP = (f"rankings to ablate, comma-separated: {', '.join(RANKINGS)} ({WU_NIAH}: "
                "Wu on the NIAH trials; the own-pass methods are scored only when named "
                "here), or baseline alone (default: the preset's)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="locos reproduce", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default=None, help="run directory (default runs/real/<model>)")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--needle-set", default="everyday",
                    help="NoLiMa needle set (shipped name or file) of the detection and "
                         "evaluation trials, unless one of the two options below is given")
    ap.add_argument("--detect-needle-set", default=None,
                    help="needle set of the detection trials (head rankings, CRI); "
                         "default: --needle-set")
    ap.add_argument("--eval-needle-set", default=None,
                    help="needle set of the evaluation trials (ablations, compression); "
                         "default: --needle-set. Give both to keep the sets disjoint "
                         "(e.g. hop_detect and hop_eval)")
    ap.add_argument("--template", choices=("chat", "completion"), default="chat")
    ap.add_argument("--data-dir", default=None,
                    help="folder with haystack/*.txt and niah_needles.jsonl (default: the "
                         "copies shipped with locos_tl)")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--detect-length", type=int, default=1000)
    ap.add_argument("--detect-haystack", default="prose",
                    help="detection book: dracula (shipped), prose (shipped, no named "
                         "people) or a text file; evaluation always uses Mohicans")
    ap.add_argument("--distractors", type=int, default=0,
                    help="distractor needles (other entries, other characters) in every "
                         "NoLiMa detection and evaluation trial: detection then accepts "
                         "answers that name the target and no distractor, and the "
                         "ablation grid records the teacher-forced name margin")
    ap.add_argument("--max-new-tokens", type=int, default=16,
                    help="greedy budget of the NoLiMa detection trials and CRI (the answer is "
                         "a name)")
    ap.add_argument("--eval-max-new-tokens", type=int, default=16)
    ap.add_argument("--niah-max-new-tokens", type=int, default=50,
                    help="greedy budget of the NIAH detection trials (Wu on NIAH): their "
                         "answers are sentences of 16-25 tokens, which 16 tokens cut off "
                         "before the trial gate (ROUGE-1 recall > 0.5) can pass; 50 is "
                         "the paper's scoring budget")
    ap.add_argument("--control-ks", default=None,
                    help="k values of the control runs (default: --ks)")
    ap.add_argument("--control-seeds", default=None,
                    help="random seeds of the control runs (default: --random-seeds)")
    ap.add_argument("--n-calibration", type=int, default=50)
    ap.add_argument("--calibration-chars", type=int, default=4000)
    ap.add_argument("--calibration-tokens", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1,
                    help="ablation stage: spread the generations over this many Ray "
                         "actors (one CPU core or GPU each; identical results)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default=None)
    ap.add_argument("--resume-from", default=None,
                    help="a published run directory (e.g. docs/real_models/smollm2): "
                         "copy its records, cells and calibration means into --out "
                         "where missing, so the run goes on on this machine; run the "
                         "trials stage with it (the trial files are rebuilt)")
    ap.add_argument("--publish", default=None,
                    help="copy the small result files here after the report "
                         "(e.g. docs/real_models/smollm2)")
    for key in PRESETS["full"]:
        ap.add_argument("--" + key.replace("_", "-"), default=None,
                        type=int if key.startswith("n_") else str,
                        help=METHODS_HELP if key == "methods" else None)
    args = ap.parse_args(argv)
    for key, v in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, v)
    if args.out is None:
        args.out = f"runs/real/{args.model.replace('/', '_')}"
    args.detect_needle_set = args.detect_needle_set or args.needle_set
    args.eval_needle_set = args.eval_needle_set or args.needle_set
    return args


def main(argv: list[str] | None = None) -> int:
    from locos_tl.models.load import load_model, model_settings

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        raise SystemExit(f"unknown stage(s) {unknown}; choose from {list(STAGES)}")
    (out / "args.json").write_text(json.dumps(vars(args), indent=1))
    if args.resume_from:
        if "trials" not in stages and not (out / "trials").is_dir():
            raise SystemExit("--resume-from: add the trials stage (--stages trials,...): "
                             "the trial files are rebuilt here, not copied")
        copied = resume_from(Path(args.resume_from), out)
        print(f"resume: {len(copied)} file(s) copied from {args.resume_from}")  # noqa: T201
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    # the model's content hashes beside its name (never the cache path it loaded from)
    args.model_hashes = model_settings(model).get("model_hashes")
    (out / "args.json").write_text(json.dumps(vars(args), indent=1))
    timings: dict[str, float] = {}
    scores: dict[str, Any] | None = None
    means = None
    from tqdm.auto import tqdm

    bar = tqdm([s for s in STAGES if s in stages], desc="reproduce", unit="stage")
    for stage in bar:
        bar.set_postfix_str(stage)
        t0 = time.perf_counter()
        if stage == "trials":
            if _trials_changed(out, args):
                build_trials(model, args, out)
        elif stage == "detect":
            scores = detect(model, args, out)
        elif stage == "calibrate":
            means = calibrate(model, args, out)
        else:
            if scores is None:
                scores = load_rankings(out)
            if stage == "ablate":
                means = means or calibrate(model, args, out)
                ablate(model, args, out, scores, means)
            elif stage == "patch":
                patch(model, args, out, scores)
            elif stage == "compress":
                compress(model, args, out, scores)
            elif stage == "report":
                report(model, args, out, scores)
        timings[stage] = round(time.perf_counter() - t0, 1)
        info: dict[str, Any] = {"seconds": timings[stage]}
        if stage == "trials":
            info["sizes"] = _trial_sizes(args)
        util._mark(out, stage, info)
        print(f"[{stage}] {timings[stage]} s", flush=True)  # noqa: T201
    return 0
