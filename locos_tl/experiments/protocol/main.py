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

Every option is a field of :class:`~locos_tl.experiments.protocol.config.ProtocolConfig`
(``locos reproduce`` builds it; :func:`run_protocol` runs it).

Usage::

    locos reproduce --model smollm2-135m-instruct --out runs/real/smollm2
    locos reproduce --model gemma-3-270m --template completion --ks 1,5,10,20 \\
        --out runs/real/gemma3

or in Python::

    run_protocol(ProtocolConfig(model="smollm2-135m-instruct", stages="trials,detect"))
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from locos_tl.errors import ConfigError
from locos_tl.experiments.protocol import common as util
from locos_tl.experiments.protocol.causal import compress, patch
from locos_tl.experiments.protocol.common import STAGES
from locos_tl.experiments.protocol.config import ProtocolConfig
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


def run_protocol(config: ProtocolConfig) -> None:
    """Run the stages ``config.stages`` asks for, in the protocol's order (module
    docstring), under ``config.out``: ``args.json`` records the configuration
    (:meth:`ProtocolConfig.settings <locos_tl.engine.options.Options.settings>`, with the
    model's content hashes once it is loaded), ``stages/<stage>.done`` each finished
    stage.

    Raises:
        ConfigError: ``resume_from`` without the trials stage (the trial files are
            rebuilt, not copied) in a run directory that has none.
        LocosError: from the stages (a run directory made with other settings, ...).
    """
    from locos_tl.models.load import load_model, model_settings

    out = Path(config.out)  # type: ignore[arg-type]  # resolved by ProtocolConfig
    stages = config.stage_list
    if config.resume_from and "trials" not in stages and not (out / "trials").is_dir():
        raise ConfigError("--resume-from: add the trials stage (--stages trials,...): the "
                          "trial files are rebuilt here, not copied")
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(config.settings(), indent=1))
    if config.resume_from:
        copied = resume_from(Path(config.resume_from), out)
        print(f"resume: {len(copied)} file(s) copied from {config.resume_from}")  # noqa: T201
    model = load_model(config.model, dtype=config.dtype, device=config.device)
    # the model's content hashes beside its name (never the cache path it loaded from)
    config = dataclasses.replace(config,
                                 model_hashes=model_settings(model).get("model_hashes"))
    (out / "args.json").write_text(json.dumps(config.settings(), indent=1))
    timings: dict[str, float] = {}
    scores: dict[str, Any] | None = None
    means = None
    from tqdm.auto import tqdm

    bar = tqdm([s for s in STAGES if s in stages], desc="reproduce", unit="stage")
    for stage in bar:
        bar.set_postfix_str(stage)
        t0 = time.perf_counter()
        if stage == "trials":
            if _trials_changed(out, config):
                build_trials(model, config, out)
        elif stage == "detect":
            scores = detect(model, config, out)
        elif stage == "calibrate":
            means = calibrate(model, config, out)
        else:
            if scores is None:
                scores = load_rankings(out)
            if stage == "ablate":
                means = means or calibrate(model, config, out)
                ablate(model, config, out, scores, means)
            elif stage == "patch":
                patch(model, config, out, scores)
            elif stage == "compress":
                compress(model, config, out, scores)
            elif stage == "report":
                report(model, config, out, scores)
        timings[stage] = round(time.perf_counter() - t0, 1)
        info: dict[str, Any] = {"seconds": timings[stage]}
        if stage == "trials":
            info["sizes"] = _trial_sizes(config)
        util._mark(out, stage, info)
        print(f"[{stage}] {timings[stage]} s", flush=True)  # noqa: T201
