"""Attribution patching (AtP) against activation patching (CRI) on a real model.

Rebuilds the trials of a published protocol run (``locos reproduce --stages trials``,
same arguments), takes the trials CRI was computed on (``heads/cri``), runs
:func:`locos_tl.experiments.atp.atp_heads` on them with CRI's corruption and greedy
budget, and prints the rank agreement: pooled over trials (all heads, Spearman and
top-k overlap, as ``compare_rankings``) and per trial (Spearman of one trial's AtP
against the same trial's CRI). Also the cost per trial. Writes
``agreement_atp_cri.csv``, ``atp_per_trial.csv`` and these AtP scores (``atp/``) into
``--publish`` (:func:`publish`), never into the run's ``heads/atp``: that folder holds
the AtP of the run's detection trials, which ``extra_rankings.py`` ranks and ablates::

    python experiments/atp_vs_cri.py --run docs/real_models/smollm2 \\
        --publish docs/real_models/smollm2/patch
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any


def main() -> None:
    import pandas as pd
    from scipy import stats

    import locos_tl as lt
    from locos_tl.experiments.atp import atp_heads
    from locos_tl.experiments.compare import compare_rankings
    from locos_tl.heads import HeadScores
    from locos_tl.trials import load_trials

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", default="docs/real_models/smollm2",
                    help="a published protocol run with heads/cri and args.json")
    ap.add_argument("--out", default="runs/atp_vs_cri")
    ap.add_argument("--publish", default=None)
    args = ap.parse_args()

    run, out = Path(args.run), Path(args.out)
    if args.publish:
        atp_folder(Path(args.publish))  # a refused folder fails before any forward pass
    cri = HeadScores.load(run / "heads" / "cri")
    settings = cri.meta["settings"]
    from published_trials import rebuild_trials, run_args

    args_run = run_args(run)
    trials_file = rebuild_trials(run, out) / "detect_onehop.jsonl"
    by_id = {t.trial_id: t for t in load_trials(trials_file)}
    subset = [by_id[i] for i in cri.trial_ids]
    model = lt.load_model(args_run["model"], device="cpu")
    t0 = time.perf_counter()
    atp = atp_heads(model, subset, corruption=settings["corruption"],
                    max_new_tokens=settings["max_new_tokens"], out_dir=out / "atp")
    seconds = time.perf_counter() - t0
    pooled = compare_rankings(atp, cri, ks=(5, 10, 20, 50))
    rows = []
    for i, tid in enumerate(cri.trial_ids):
        j = atp.trial_ids.index(tid) if tid in atp.trial_ids else None
        if j is None:
            continue
        a, c = atp.trial_scores[j].flatten(), cri.trial_scores[i].flatten()
        rho, p = stats.spearmanr(a.numpy(), c.numpy())
        rows.append({"trial_id": tid, "spearman": rho, "spearman_p": p})
    per_trial = pd.DataFrame(rows)
    print(pooled.to_string(index=False))  # noqa: T201
    print(f"per trial Spearman: mean {per_trial['spearman'].mean():.3f}, "  # noqa: T201
          f"min {per_trial['spearman'].min():.3f}, max {per_trial['spearman'].max():.3f} "
          f"({len(per_trial)} trials)")
    print(f"AtP: {seconds / max(1, len(subset)):.2f} s per trial "  # noqa: T201
          f"({len(subset)} trials, including a resumed run's reuse)")
    if args.publish:
        publish(Path(args.publish), pooled, per_trial, atp)


def publish(dest: Path, pooled: Any, per_trial: Any, atp: Any) -> Path:
    """Write the comparison into ``dest`` (the run's ``patch/``): the pooled agreement
    (``agreement_atp_cri.csv``), the per-trial Spearman (``atp_per_trial.csv``) and the
    AtP scores over the CRI trials (``dest/atp/``: ``head_scores.json``, ``heads.json``,
    ``scores.csv``).

    Args:
        dest: the folder to publish into.
        pooled, per_trial: pandas tables, as :func:`main` prints them.
        atp: the ``HeadScores`` of AtP over the CRI trials.

    Returns:
        The folder the AtP scores went to, ``dest/atp``.

    Raises:
        ValueError: ``dest`` is a ``heads`` folder, whose ``atp`` holds the AtP of the
            run's detection trials, the scores ``extra_rankings.py`` ablated.
    """
    folder = atp_folder(dest)
    dest.mkdir(parents=True, exist_ok=True)
    pooled.to_csv(dest / "agreement_atp_cri.csv", index=False)
    per_trial.to_csv(dest / "atp_per_trial.csv", index=False)
    atp.save(folder)
    return folder


def atp_folder(dest: Path) -> Path:
    """Where :func:`publish` saves the AtP scores over the CRI trials: ``dest/atp``.

    Raises:
        ValueError: ``dest`` is a ``heads`` folder, whose ``atp`` holds the AtP of the
            run's detection trials, the scores ``extra_rankings.py`` ablated.
    """
    if dest.name == "heads":
        raise ValueError(f"--publish {dest}: a heads folder, whose atp is the AtP of the "
                         "run's detection trials; publish into the run's patch/ folder")
    return dest / "atp"


if __name__ == "__main__":
    main()
