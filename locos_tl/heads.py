"""``HeadScores``: per-head scores of one method, built from per-trial records.

Aggregation (docs/concepts.md): head score = mean over accepted trials of the per-trial
score; also the step-pooled mean (every used step weighted equally) and a bootstrap
95 % CI over trials (1000 resamples, seeded).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from locos_tl.errors import DataFormatError, NoAcceptedTrialError, warn_caller
from locos_tl.head_spec import HeadSpecError, as_count, check_confidence

Head = tuple[int, int]


def head_label(layer: int, head: int) -> str:
    """``"L{layer}H{head}"``, the TransformerLens label of a head."""
    return f"L{layer}H{head}"


@dataclass
class HeadScores:
    """Scores of every attention head under one method.

    Attributes:
        method: ``"locos"``, ``"wu"``, ``"headkv"``, ``"headkv_anchor"``,
            ``"attention_spatial"``, ``"dla"``,
            ``"cri"``, or another name.
        trial_scores: ``[n_trials, n_layers, n_heads]`` per accepted trial (NaN where a
            head has no value for a trial). Units: logits for ``locos``/``dla``/``cri``,
            probability for the attention baselines.
        trial_ids: ids of the accepted trials, in order.
        variant: unembedding variant (``"raw"``/``"exact"``) or ``""``.
        step_scores: ``[n_steps, n_layers, n_heads]`` values of every used step of every
            accepted trial (for the step-pooled mean), or None.
        meta: provenance (model, versions, seed, trial-set hash, counts of dropped trials).
        seed: seed of the bootstrap.
        records: the per-trial records of the run (accepted and dropped: response,
            ROUGE-1 recall, answer steps, ...), when built by ``score_trials``.
    """

    method: str
    trial_scores: Float[Tensor, "n_trials n_layers n_heads"]
    trial_ids: list[str] = field(default_factory=list)
    variant: str = ""
    step_scores: Float[Tensor, "n_steps n_layers n_heads"] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    records: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.trial_scores = torch.as_tensor(self.trial_scores, dtype=torch.float64)
        if self.trial_scores.ndim != 3:
            raise ValueError(
                "trial_scores must be [n_trials, n_layers, n_heads], got "
                f"{tuple(self.trial_scores.shape)}"
            )
        if self.step_scores is not None:
            self.step_scores = torch.as_tensor(self.step_scores, dtype=torch.float64)

    # -- shape ------------------------------------------------------------------
    @property
    def n_trials(self) -> int:
        return int(self.trial_scores.shape[0])

    @property
    def n_contributing(self) -> Tensor:
        """``[n_layers, n_heads]`` int: trials whose score for the head is finite (the
        trials its mean is taken over; NaN values are skipped, so not counted)."""
        return torch.isfinite(self.trial_scores).sum(0)

    @property
    def n_layers(self) -> int:
        return int(self.trial_scores.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.trial_scores.shape[2])

    # -- aggregates -------------------------------------------------------------
    @cached_property
    def scores(self) -> Float[Tensor, "n_layers n_heads"]:
        """Mean over accepted trials of the per-trial score (NaN with no trial)."""
        if self.n_trials == 0:
            return torch.full((self.n_layers, self.n_heads), float("nan"), dtype=torch.float64)
        return torch.nanmean(self.trial_scores, 0)

    @cached_property
    def pooled(self) -> Float[Tensor, "n_layers n_heads"] | None:
        """Step-pooled mean over every used step of every accepted trial, or None."""
        if self.step_scores is None or self.step_scores.shape[0] == 0:
            return None
        return torch.nanmean(self.step_scores, 0)

    @cached_property
    def ci(self) -> tuple[Tensor, Tensor]:
        """Bootstrap 95 % CI of :attr:`scores` over trials (1000 resamples, ``seed``)."""
        return self.bootstrap_ci()

    def bootstrap_ci(
        self, n_resamples: int = 1000, level: float | int = 0.95
    ) -> tuple[Float[Tensor, "n_layers n_heads"], Float[Tensor, "n_layers n_heads"]]:
        """Percentile bootstrap CI of the mean over trials.

        Args:
            n_resamples: bootstrap resamples (seeded by :attr:`seed`).
            level: confidence level in (0, 1), e.g. 0.95.

        Returns:
            ``(low, high)``, each ``[n_layers, n_heads]``; NaN with fewer than 2 trials.

        Raises:
            ValueError: ``level`` is not a level in (0, 1)
                (:func:`locos_tl.experiments.stats.check_confidence`).
        """
        level = check_confidence(level, "level")
        n = self.n_trials
        shape = (self.n_layers, self.n_heads)
        if n < 2:
            nan = torch.full(shape, float("nan"), dtype=torch.float64)
            return nan, nan.clone()
        rng = np.random.default_rng(self.seed)
        flat = self.trial_scores.reshape(n, -1).numpy()
        means = np.empty((n_resamples, flat.shape[1]))
        with warnings.catch_warnings():  # a resample holding only NaN for a head: NaN,
            warnings.simplefilter("ignore", RuntimeWarning)  # which nanquantile skips
            for i in range(0, n_resamples, 100):
                idx = rng.integers(0, n, size=(min(100, n_resamples - i), n))
                means[i : i + len(idx)] = np.nanmean(flat[idx], axis=1)
        a = (1 - level) / 2
        low, high = np.nanquantile(means, [a, 1 - a], axis=0)
        return (torch.from_numpy(low).reshape(shape), torch.from_numpy(high).reshape(shape))

    # -- rankings ---------------------------------------------------------------
    def check_rankable(self) -> None:
        """Refuse to rank a score set in which no head has a score.

        Raises:
            NoAcceptedTrialError: (a :class:`LocosError` and ``ValueError``) no
                accepted trial, or every score NaN: an order would only be the head
                index order. The message gives the drop counts in ``meta``.
        """
        if self.n_trials and not bool(torch.isnan(self.scores).all()):
            return
        m = self.meta
        counts = ", ".join(f"{k[len('n_dropped_'):]}: {m[k]}" for k in sorted(m)
                           if k.startswith("n_dropped_") and m[k])
        raise NoAcceptedTrialError(
            f"cannot rank the {self.method!r} heads: no accepted trial contributed a score "
            f"({self.n_trials} of {m.get('n_trials', '?')} trials"
            + (f"; dropped {counts}" if counts else "") + "), so every head score is NaN. "
            "Check the responses in the run's trials.jsonl (records_frame()), use trials "
            "the model answers, or a larger max_new_tokens"
        )

    def ranked(self, descending: bool = True) -> list[Head]:
        """All heads ordered by score (NaN last), ties broken by (layer, head).

        Raises:
            LocosError: no head has a score (no accepted trial); see
                :meth:`check_rankable`.
        """
        self.warn_if_all_zero()
        return self._order(descending)

    @property
    def all_zero(self) -> bool:
        """Whether every finite score is exactly 0 (and at least one is finite): the
        ranking is then index order (ties broken by ``(layer, head)``), not a result."""
        finite = self.scores[torch.isfinite(self.scores)]
        return bool(finite.numel()) and bool((finite == 0).all())

    def warn_if_all_zero(self) -> None:
        """Warn (``RuntimeWarning``, at the caller's line) when :attr:`all_zero`: a
        ranking of all-zero scores is the heads' index order, not a result."""
        if self.all_zero:
            warn_caller(f"{self.method}: every score is 0: the ranking is index order, "
                        "not a result", RuntimeWarning)

    def _order(self, descending: bool) -> list[Head]:
        self.check_rankable()
        flat = self.scores.flatten().clone()
        fill = float("-inf") if descending else float("inf")
        flat[torch.isnan(flat)] = fill
        order = sorted(range(flat.numel()), key=lambda i: (-flat[i] if descending else flat[i], i))
        return [divmod(i, self.n_heads) for i in order]

    def top_k(self, k: int) -> list[Head]:
        """The ``k`` highest-scoring heads as ``(layer, head)`` pairs.

        Raises:
            LocosError: no head has a score (no accepted trial); ``k`` is not an
                integer in ``0..n_layers * n_heads`` (``HeadSpecError``, a
                ``ValueError``, naming the model's head count).
        """
        n = self._count(k)
        self.warn_if_all_zero()
        return self._order(True)[:n]

    def bottom_k(self, k: int) -> list[Head]:
        """The ``k`` lowest-scoring heads (the bottom-k ablation control).

        Raises:
            LocosError: no head has a score (no accepted trial); ``k`` is not an
                integer in ``0..n_layers * n_heads`` (``HeadSpecError``).
        """
        n = self._count(k)
        self.warn_if_all_zero()
        return self._order(False)[:n]

    def _count(self, k: int) -> int:
        """``k`` as a head count of this model (``HeadSpecError`` above the total)."""
        n, total = as_count(k), self.n_layers * self.n_heads
        if n > total:
            raise HeadSpecError(f"k = {n} is more heads than there are: {total} in all "
                                f"({self.n_layers} layers x {self.n_heads} heads)")
        return n

    # -- tables and files -------------------------------------------------------
    def to_frame(self) -> pd.DataFrame:
        """One row a head: ``layer, head, label, score, ci_low, ci_high, pooled,
        n_trials, method, variant``, sorted by score descending. ``n_trials`` is per
        head: the trials whose score for it is finite (those its mean is taken over)."""
        low, high = self.ci
        L, H = self.n_layers, self.n_heads
        layer, head = np.divmod(np.arange(L * H), H)
        pooled = self.pooled
        df = pd.DataFrame(
            {
                "layer": layer,
                "head": head,
                "label": [head_label(int(a), int(b)) for a, b in zip(layer, head, strict=True)],
                "score": self.scores.flatten().numpy(),
                "ci_low": low.flatten().numpy(),
                "ci_high": high.flatten().numpy(),
                "pooled": pooled.flatten().numpy() if pooled is not None else np.nan,
                "n_trials": self.n_contributing.flatten().numpy(),
                "method": self.method,
                "variant": self.variant,
            }
        )
        return df.sort_values(["score", "layer", "head"], ascending=[False, True, True],
                              na_position="last").reset_index(drop=True)

    def to_reference_dict(self) -> dict[str, list[float]]:
        """The reference implementation's format: ``{"layer-head": [per-trial scores]}``."""
        flat = rearrange(self.trial_scores, "trial layer head -> (layer head) trial")
        return {
            f"{i // self.n_heads}-{i % self.n_heads}": [float(x) for x in flat[i].tolist()]
            for i in range(flat.shape[0])
        }

    def to_reference_json(self, path: str | Path) -> Path:
        """Write :meth:`to_reference_dict` as JSON."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_reference_dict()))
        return path

    @classmethod
    def from_reference_json(
        cls, path: str | Path, *, method: str = "locos", n_layers: int | None = None,
        n_heads: int | None = None,
    ) -> HeadScores:
        """Read a ``{"layer-head": [per-trial scores]}`` file (heads ranked by mean).

        Lists of unequal length are padded with NaN. ``n_layers``/``n_heads`` default to
        the largest indices present plus one.

        Raises:
            DataFormatError: not a JSON object of ``"l-h"`` keys to lists of numbers.
        """
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
            items = {tuple(int(x) for x in k.split("-")): [float(v) for v in vs]
                     for k, vs in raw.items()}
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise DataFormatError(f"{path}: not a head-score file ({exc})") from exc
        if not items or any(len(k) != 2 for k in items):
            raise DataFormatError(f"{path}: keys must look like 'layer-head', e.g. '14-3'")
        L = n_layers or max(k[0] for k in items) + 1
        H = n_heads or max(k[1] for k in items) + 1
        T = max(len(v) for v in items.values())
        arr = torch.full((T, L, H), float("nan"), dtype=torch.float64)
        for (l, h), vs in items.items():
            arr[: len(vs), l, h] = torch.tensor(vs, dtype=torch.float64)
        return cls(method=method, trial_scores=arr, meta={"source": str(path)})

    def save(self, out_dir: str | Path) -> Path:
        """Write ``heads.json`` (reference format), ``scores.csv`` (:meth:`to_frame`) and
        ``head_scores.json`` (everything, for :meth:`load`) into ``out_dir``.

        Warns (``RuntimeWarning``) when no trial was accepted: ``heads.json`` then holds
        an empty list per head.
        """
        if self.n_trials == 0:
            warn_caller(f"{self.method}: no accepted trial; {Path(out_dir)}/heads.json "
                        "holds an empty list per head and scores.csv only NaN",
                        RuntimeWarning)
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.to_reference_json(out / "heads.json")
        self.to_frame().to_csv(out / "scores.csv", index=False)
        full = {
            "method": self.method,
            "variant": self.variant,
            "seed": self.seed,
            "shape": [self.n_layers, self.n_heads],
            "trial_ids": self.trial_ids,
            "trial_scores": self.trial_scores.tolist(),
            "step_scores": None if self.step_scores is None else self.step_scores.tolist(),
            "meta": self.meta,
        }
        (out / "head_scores.json").write_text(json.dumps(full))
        return out

    @classmethod
    def load(cls, out_dir: str | Path) -> HeadScores:
        """Read what :meth:`save` wrote (``head_scores.json``; else ``heads.json``): the
        reader of one saved folder. To load head scores from anything the package
        writes (a scoring run directory, a method folder, a file), use
        :func:`locos_tl.load_head_scores`, which reads those folders with this.

        Raises:
            FileNotFoundError: neither file exists in ``out_dir``.
        """
        out = Path(out_dir)
        full_path = out / "head_scores.json"
        if not full_path.exists():
            if (out / "heads.json").exists():
                return cls.from_reference_json(out / "heads.json")
            subs = sorted(p.parent.name for p in out.glob("*/head_scores.json"))
            hint = (f"; it holds several methods: use one of "
                    f"{', '.join(str(out / s) for s in subs)}") if subs else ""
            raise FileNotFoundError(f"no head_scores.json or heads.json in {out}{hint}")
        d = json.loads(full_path.read_text())
        steps = d.get("step_scores")
        trial_scores = torch.tensor(d["trial_scores"], dtype=torch.float64)
        if trial_scores.numel() == 0 and "shape" in d:  # no accepted trial
            trial_scores = trial_scores.reshape(0, *d["shape"])
        return cls(
            method=d["method"],
            trial_scores=trial_scores,
            trial_ids=list(d.get("trial_ids", [])),
            variant=d.get("variant", ""),
            step_scores=None if steps is None else torch.tensor(steps, dtype=torch.float64),
            meta=d.get("meta", {}),
            seed=int(d.get("seed", 0)),
        )

    @classmethod
    def from_records(
        cls, records: Sequence[dict[str, Any]], method: str, *, n_layers: int, n_heads: int,
        variant: str = "", meta: dict[str, Any] | None = None, seed: int = 0,
    ) -> HeadScores:
        """Aggregate per-trial records (see ``locos_tl.experiments.score``) for one method.

        A record contributes when ``method`` accepted it (per-method acceptance,
        :func:`locos_tl.acceptance.method_accepted`) and has a score for ``method`` that
        is not NaN everywhere (such a trial adds nothing to any mean, so it is not
        counted).
        """
        from locos_tl.acceptance import method_accepted

        scores, ids, steps = [], [], []
        for r in records:
            s = (r.get("scores") or {}).get(method)
            if not method_accepted(r, method) or s is None:
                continue
            score = torch.tensor(s, dtype=torch.float64)
            if bool(torch.isnan(score).all()):
                continue
            scores.append(score)
            ids.append(r["trial_id"])
            for st in (r.get("step_values") or {}).get(method, []):
                steps.append(torch.tensor(st, dtype=torch.float64))
        shape = (n_layers, n_heads)
        trial_scores = (torch.stack(scores) if scores
                        else torch.zeros((0, *shape), dtype=torch.float64))
        step_scores = torch.stack(steps) if steps else None
        return cls(method=method, trial_scores=trial_scores, trial_ids=ids, variant=variant,
                   step_scores=step_scores, meta=dict(meta or {}), seed=seed,
                   records=list(records))

    def records_frame(self) -> pd.DataFrame:
        """One row a trial of :attr:`records`: ``trial_id, accepted, dropped, response,
        answer, rouge1_recall, n_answer_steps, n_prompt_tokens`` plus the trial's meta."""
        rows = [
            {
                "trial_id": r["trial_id"],
                "accepted": r.get("accepted"),
                "dropped": r.get("dropped"),
                "response": r.get("response"),
                "answer": r.get("answer"),
                "rouge1_recall": r.get("rouge1_recall"),
                "n_answer_steps": len(r.get("answer_steps", [])),
                "n_prompt_tokens": r.get("n_prompt_tokens"),
                **(r.get("meta") or {}),
            }
            for r in self.records
        ]
        return pd.DataFrame(rows)
