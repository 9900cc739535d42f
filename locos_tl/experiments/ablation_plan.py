"""The grid of an ablation sweep: which head sets to ablate for each ranking, k and seed
(the baseline, the top-k of each ranking, seeded random heads, the bottom-k control),
shared by :func:`locos_tl.experiments.evaluate.ablation_sweep` and
:func:`locos_tl.experiments.teacher_forced.teacher_forced_sweep`."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from locos_tl.engine.ablation import AblationMeans, random_heads
from locos_tl.errors import warn_caller
from locos_tl.experiments.dissociation import BASELINE
from locos_tl.experiments.run_table import AblationJob
from locos_tl.head_spec import HeadLike, HeadSpecError, as_int, parse_heads, parse_ks
from locos_tl.heads import Head, HeadScores

DEFAULT_KS = (1, 5, 10, 20, 50, 100)
RANDOM = "random"


def means_hash(means: AblationMeans | None) -> str | None:
    if means is None:
        return None
    h = hashlib.sha256(means.q.numpy().tobytes())
    h.update(means.z.numpy().tobytes())
    return h.hexdigest()[:16]


def _ranking(hs: Sequence[HeadLike] | HeadScores, name: str, n_layers: int,
             n_heads: int) -> list[Head]:
    if isinstance(hs, HeadScores):
        return hs.ranked(True)
    return parse_heads(hs, n_layers=n_layers, n_heads=n_heads, what=f"head_sets[{name!r}]",
                       unique=True)


def _check_head_sets(head_sets: Any) -> None:
    if not isinstance(head_sets, Mapping):
        raise HeadSpecError("head_sets must be a dict {name: ranking}, e.g. "
                            "{'locos': scores, 'mine': [(14, 3), 'L20H1']}, got "
                            f"{type(head_sets).__name__}")
    for name in head_sets:
        if not isinstance(name, str) or not name:
            raise HeadSpecError(f"head_sets keys must be non-empty method names, got {name!r}")


def build_jobs(
    head_sets: Mapping[str, Sequence[HeadLike] | HeadScores],
    ks: Sequence[int],
    *,
    n_layers: int,
    n_heads: int,
    seeds: Sequence[int] = (0, 1, 2),
    random: bool = True,
    bottom: str | None = "auto",
) -> list[AblationJob]:
    """The sweep's cells: the baseline (k=0), top-k of every head set, random heads per
    seed and the bottom-k control.

    Args:
        head_sets: method name -> :class:`HeadScores` or a ranked list of heads in any
            form of :func:`locos_tl.head_spec.parse_heads` (``(14, 3)``, ``"L14H3"``,
            ``"14-3"``; no head twice).
        ks: the k values, each in ``0..n_layers * n_heads`` (0 is the baseline, always
            run); a k beyond a head list's length is skipped for it (:func:`evaluate`
            warns and records it).
        n_layers, n_heads: the model's geometry (for random heads).
        seeds: seeds of the random-heads control (method ``"random"``).
        random: include the random control.
        bottom: name of the :class:`HeadScores` entry whose lowest-scoring heads form the
            bottom-k control (method ``"<name>_bottom"``); ``"auto"``: ``"locos"`` if
            present, else the first :class:`HeadScores`; None: no bottom-k control.

    Raises:
        HeadSpecError: (a ``ValueError``) a k that is not an integer or outside
            ``0..n_layers * n_heads``; a malformed, out-of-range or repeated head.
        ValueError: ``bottom`` names no :class:`HeadScores` entry.
    """
    _check_head_sets(head_sets)
    ks = [x for x in parse_ks(ks, n_total=n_layers * n_heads, allow_zero=True) if x > 0]
    jobs = [AblationJob(BASELINE, 0, 0, ())]
    for name, hs in head_sets.items():
        ranking = _ranking(hs, name, n_layers, n_heads)
        jobs += [AblationJob(name, k, 0, tuple(ranking[:k])) for k in ks if k <= len(ranking)]
    if random:
        for seed in seeds:
            jobs += [AblationJob(RANDOM, k, int(seed), tuple(random_heads(n_layers, n_heads, k,
                                                                          int(seed))))
                     for k in ks]  # parse_ks: every k <= n_layers * n_heads
    if bottom == "auto":
        scored = [n for n, hs in head_sets.items() if isinstance(hs, HeadScores)]
        bottom = "locos" if "locos" in scored else (scored[0] if scored else None)
    if bottom is not None:
        src = head_sets.get(bottom)
        if not isinstance(src, HeadScores):
            raise ValueError(f"bottom-k control: {bottom!r} is not a HeadScores entry of "
                             f"head_sets ({sorted(head_sets)})")
        low = src.ranked(False)
        jobs += [AblationJob(f"{bottom}_bottom", k, 0, tuple(low[:k])) for k in ks
                 if k <= len(low)]
    return jobs


def plan_grid(
    model: Any,
    head_sets: Mapping[str, Sequence[HeadLike] | HeadScores],
    k: int | Sequence[int] | None,
    seeds: int | Sequence[int],
    *,
    random: bool = True,
    bottom: str | None = "auto",
) -> tuple[list[int], list[int], list[AblationJob], dict[str, list[int]]]:
    """The checked grid of an ablation sweep (:func:`ablation_sweep`, and the
    teacher-forced :func:`locos_tl.experiments.teacher_forced.teacher_forced_sweep`):
    ``(ks, seeds, jobs, skipped_k)``. ``k=None`` is :data:`DEFAULT_KS` up to the
    model's head count. Warns (``UserWarning``) when a head set lists fewer heads than
    a k: that k is skipped for it (``skipped_k``).

    Raises:
        HeadSpecError: (a ``ValueError``) ``head_sets`` is not a dict of rankings; a
            malformed, repeated or out-of-range head; a k or seed that is not an integer
            or out of range.
        ValueError: a :class:`HeadScores` of another geometry than the model's, or with
            no accepted trial; ``bottom`` names no :class:`HeadScores` entry.
    """
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    _check_head_sets(head_sets)
    if k is None:
        ks = [x for x in DEFAULT_KS if x <= L * H]
    else:
        ks = parse_ks(k, n_total=L * H, what="k")
    seeds = [as_int(s, "seeds") for s in ([seeds] if isinstance(seeds, int) else seeds)]
    jobs = build_jobs(head_sets, ks, n_layers=L, n_heads=H, seeds=seeds, random=random,
                      bottom=bottom)
    made = {(j.method, j.k) for j in jobs}
    skipped = {name: [x for x in ks if (name, x) not in made] for name in head_sets}
    skipped = {name: v for name, v in skipped.items() if v}
    if skipped:
        warn_caller("; ".join(f"head set {n!r} lists fewer heads than k={v}: those k are "
                              "skipped for it" for n, v in skipped.items()))
    for name, hs in head_sets.items():  # fail before any generation, not halfway through
        if isinstance(hs, HeadScores):
            if (hs.n_layers, hs.n_heads) != (L, H):
                raise ValueError(f"head set {name!r} scores {hs.n_layers} layers x "
                                 f"{hs.n_heads} heads; the model has {L} x {H}")
            if hs.n_trials == 0:
                raise ValueError(f"head set {name!r} has no accepted trial: its ranking is "
                                 "all NaN")
    return ks, seeds, jobs, skipped
