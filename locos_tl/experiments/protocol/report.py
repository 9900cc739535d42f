"""The protocol's report: tables and figures from the finished stages, and copying a
run to or from a published directory (:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from locos_tl.experiments.protocol import common as util
from locos_tl.experiments.protocol.common import DS_METRICS, _ints, _questions
from locos_tl.experiments.protocol.config import ProtocolConfig
from locos_tl.experiments.protocol.paired import paired_table
from locos_tl.experiments.protocol.stages import job_keys
from locos_tl.experiments.protocol.tables import (
    compression_accuracy,
    evaluation_table,
    headline,
    interval_table,
    trial_values,
)


def report(model: Any, config: ProtocolConfig, out: Path, scores: dict[str, Any]) -> None:
    from locos_tl import plot
    from locos_tl.experiments.evaluate import dissociation_score
    from locos_tl.heads import head_label

    figs = out / "figures"
    figs.mkdir(parents=True, exist_ok=True)
    ks = _ints(config.ks)
    k_head = max(ks)
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    keys = job_keys(config, scores, L, H)
    tables = {}  # (question, length) -> the sweep's table, from the records
    values = {}  # (question, length) -> its per-trial scores
    for length in _ints(config.eval_lengths):
        for qtype in ("onehop", "direct"):
            run = out / "ablate" / f"{qtype}_{length}"
            if not (run / "trials.jsonl").exists():
                continue
            trials = util._load(out / "trials" / f"eval_{qtype}_{length}.jsonl")
            values[qtype, length] = trial_values(run, trials, "nolima", keys)
            ev = interval_table(values[qtype, length])
            ev.to_csv(run / "evaluation_ci.csv", index=False)
            tables[qtype, length] = ev
    head = headline(tables, k_head, values)
    head.to_csv(out / "headline.csv", index=False)
    paired = [paired_table(v).assign(question=q, length=n) for (q, n), v in values.items()]
    if paired:
        pd.concat(paired, ignore_index=True).to_csv(out / "paired.csv", index=False)
    from locos_tl.models.load import model_settings

    identity = model_settings(model)  # name and content hashes, never a cache path
    if identity["model"] == "unknown":  # a bridge that records no checkpoint
        identity = {"model": config.model}
    summary: dict[str, Any] = {**identity, "n_layers": L, "n_heads": H,
                               "preset": config.preset, "settings": config.settings()}
    for name, hs in scores.items():
        summary.setdefault("n_accepted", {})[name] = int(hs.n_trials)
        if hs.n_trials:
            summary.setdefault("top10", {})[name] = [head_label(*h) for h in hs.top_k(10)]
            hs.save(out / "heads" / name)  # head_scores.json, heads.json, scores.csv
    window = _sliding_layers(model)
    if window is not None:
        full = [l for l in range(L) if l not in window]
        summary["full_attention_layers"] = full
        for name in ("locos", "wu", "wu_niah"):
            if name in scores and scores[name].n_trials:
                top = scores[name].top_k(min(k_head, L * H))
                summary.setdefault("top_k_on_full_layers", {})[name] = sum(
                    1 for l, _ in top if l in full)
    controls = {}  # the control runs' tables, from their records
    for control in ("parametric", "arithmetic"):
        c = out / "ablate" / f"control_{control}"
        if (c / "trials.jsonl").exists():
            controls[control] = evaluation_table(
                c, util._load(out / "trials" / f"control_{control}.jsonl"), "control",
                job_keys(config, scores, L, H, control=True))
    length = _ints(config.eval_lengths)[0]  # DS(k) at the first length
    ds_rows = []
    for (qtype, at), ev in tables.items():
        if set(ev["method"]) <= {"baseline"}:  # nothing run yet, or --methods baseline
            continue
        # k on a log axis: 1, 5, 10, 20, 50 spread out; the baseline is a dashed line
        fig = plot.ablation_curves(ev, metrics=["rougeL", "contains"], log_x=True,
                                   title=f"{config.model}: {qtype} at {at} tokens")
        _write(fig, figs / f"ablation_{qtype}_{at}")
        if at != length:
            continue
        for control, cev in controls.items():
            # the paper's metrics (ROUGE-L F / exact match), and "contains" on both
            # sides: a chat model that answers in a sentence scores exact match 0
            for r_metric, c_metric in DS_METRICS:
                ds = dissociation_score(ev, cev, retrieval_metric=r_metric,
                                        control_metric=c_metric)
                ds["question"], ds["control"] = qtype, control
                ds["retrieval_metric"], ds["control_metric"] = r_metric, c_metric
                ds_rows.append(ds)
    if ds_rows:
        ds = pd.concat(ds_rows, ignore_index=True)
        ds.to_csv(out / "dissociation.csv", index=False)
        for qtype in _questions(config):
            sub = ds[(ds["question"] == qtype) & (ds["control"] == "parametric")
                     & (ds["retrieval_metric"] == "contains")]
            if not sub.empty and sub["ds"].notna().any():
                _write(plot.dissociation(sub, title=f"{config.model}: DS(k), {qtype} vs "
                                         "parametric (contains)"),
                       figs / f"dissociation_{qtype}")
    for name in ("locos", "wu", "wu_niah"):
        if name in scores and scores[name].n_trials:
            _write(plot.head_heatmap(scores[name], title=f"{config.model}: {name}"),
                   figs / f"heatmap_{name}")
    valid = [scores[m] for m in ("locos", "wu_niah", "wu") if m in scores
             and scores[m].n_trials]
    if valid:
        _write(plot.layer_distribution(valid, k=min(20, L * H)),
               figs / "layer_distribution")
    for agree in sorted((out / "patch").glob("agreement_*_cri.csv")):
        name = agree.stem.removeprefix("agreement_").removesuffix("_cri")
        summary.setdefault("vs_cri", {})[name] = (
            pd.read_csv(agree).iloc[0].to_dict())  # the "all heads" bucket
    comp = out / "compress" / "compression.csv"
    if comp.exists():
        df = pd.read_csv(comp)
        _write(plot.compression_curves(df, y="answer_correct"), figs / "compression")
        compression_accuracy(df).to_csv(out / "compress" / "accuracy.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(head.to_string(index=False))  # noqa: T201
    if config.publish:
        publish(out, Path(config.publish))


#: the small result files copied into the docs (``--publish``); the run keeps the rest
PUBLISHED = ("summary.json", "headline.csv", "dissociation.csv", "paired.csv", "args.json",
             "detect/meta.json", "detect/trials.jsonl",  # detection records (resume)
             "detect_niah/meta.json", "detect_niah/trials.jsonl",
             "means.safetensors",  # the calibrated query means (resume: see RESUMABLE)
             "patch/agreement_*_cri.csv", "compress/accuracy.csv",
             "compress/compression.csv",  # every compressed answer
             "ablate/*/evaluation_ci.csv",  # every job of the grid, from the records
             "ablate/*/trials.jsonl", "ablate/*/meta.json",  # every response (resume)
             "ablate/*/jobs.json",  # every cell of every call (meta.json: the last call)
             "heads/*/head_scores.json", "heads/*/heads.json",
             "patch/trials.jsonl", "patch/meta.json",  # CRI's records (resume, grow)
             "figures/*.png", "stages/*.done")  # CRI: heads/cri


def publish(out: Path, dest: Path) -> None:
    """Copy the run's small result files (tables, head scores, PNG figures) to ``dest``."""
    import shutil

    for pattern in PUBLISHED:
        for src in sorted(out.glob(pattern)):
            target = dest / src.relative_to(out)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


#: what a run reads back to go on where it stopped, copied from a published directory by
#: ``--resume-from``: the detection and ablation records, the cells, the calibrated query
#: means (recalibrating on another CPU changes their last bits, and a run refuses to mix
#: means: ``means_hash``), CRI's records, scores and agreements (runs published before
#: the records were: :func:`saved_cri`), every ranking's head scores (AtP and QRHead have
#: no records: :func:`~locos_tl.experiments.protocol.stages.load_rankings` reads them
#: here) and the compressed answers. The
#: trial files are not among them: the ``trials`` stage rebuilds them (deterministic).
RESUMABLE = ("means.safetensors", "detect/meta.json", "detect/trials.jsonl",
             "detect_niah/meta.json", "detect_niah/trials.jsonl",
             "ablate/*/trials.jsonl", "ablate/*/jobs.json", "ablate/*/meta.json",
             "patch/agreement_*_cri.csv", "patch/trials.jsonl", "patch/meta.json",
             "heads/*/head_scores.json", "heads/*/heads.json",
             "compress/compression.csv")


def resume_from(src: Path, out: Path) -> list[str]:
    """Copy the files of :data:`RESUMABLE` from a published run ``src`` into the run
    directory ``out`` where ``out`` lacks them (a file already there is kept), so a run
    made on another machine (say the committed ``docs/real_models/smollm2``) goes on
    here. Returns the copied paths, relative to ``out``.

    Raises:
        FileNotFoundError: ``src`` is not a directory or holds none of them.
    """
    import shutil

    if not src.is_dir():
        raise FileNotFoundError(f"--resume-from {src}: not a directory")
    found = [f for pattern in RESUMABLE for f in sorted(src.glob(pattern))]
    if not found:
        raise FileNotFoundError(f"--resume-from {src}: holds no file a run reads back "
                                f"({', '.join(RESUMABLE[:3])}, ...)")
    copied = []
    for f in found:
        target = out / f.relative_to(src)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
        copied.append(str(f.relative_to(src)))
    return copied


def _sliding_layers(model: Any) -> set[int] | None:
    cfg = getattr(getattr(model, "original_model", None), "config", None)
    types = getattr(cfg, "layer_types", None)
    if not types:
        return None
    return {i for i, t in enumerate(types) if "sliding" in str(t)}


def _write(fig: Any, stem: Path) -> None:
    """``stem.html`` and ``stem.png`` (kaleido or headless Chromium; HTML only if neither)."""
    import sys

    fig.write_html(str(stem) + ".html", include_plotlyjs="cdn")
    # PNGs are rendered by the repository's docs/scripts/render_figures.py (a source
    # checkout); an installed package writes the HTML figures only
    scripts = Path(__file__).resolve().parents[3] / "docs" / "scripts"
    if not (scripts / "render_figures.py").exists():
        return
    if str(scripts) not in sys.path:  # once, not once per figure
        sys.path.insert(0, str(scripts))
    from render_figures import save_png

    print(save_png(fig, Path(str(stem) + ".png")))  # noqa: T201
