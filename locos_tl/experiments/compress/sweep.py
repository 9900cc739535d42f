"""Accuracy against retained KV fraction, for several head rankings, in one run.

Each trial's context is prefilled once; every (ranking, fraction) compresses a copy of
that one full cache (:func:`locos_tl.experiments.compress.cache.compress_cache` never modifies it).
Budgets that retain the same positions (every ranking at the fraction 1.0, or every
ranking held at the sinks + recent floor) are decoded once per trial and their row
repeated: greedy decoding of one compressed cache is one result.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from locos_tl.errors import LocosError, TrialError, warn_caller
from locos_tl.experiments.compress.budgets import as_score_array, kv_budgets
from locos_tl.experiments.compress.cache import cache_capacity, compression_twin
from locos_tl.experiments.compress.fractions import check_fractions
from locos_tl.experiments.compress.generate import (
    compressed_generate,
    n_heads_of,
    prefill_context,
    query_start_of,
)
from locos_tl.experiments.methods import check_trials
from locos_tl.trials import Trial, as_trial_list

DEFAULT_FRACTIONS: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _query_start_problem(model: Any, trial: Trial, options: Any) -> str | None:
    """Why ``trial`` has no usable question start (None: it has one): neither its
    ``meta["query_start"]`` nor ``options["query_start"]``, or one outside the prompt
    (:func:`~locos_tl.experiments.compress.generate.query_start_of`)."""
    own = trial.meta.get("query_start")
    try:
        query_start_of(trial, own if own is not None else options.get("query_start"))
    except TrialError as exc:
        return str(exc)
    return None


def _budget_key(b: Any) -> tuple:
    """What fixes the positions a budget retains for every query head
    (:meth:`Budgets.head_positions`): two budgets with one key compress a cache alike."""
    return (b.unit, b.context_len, b.sinks, b.n_heads, b.n_kv_heads, b.entries.shape,
            np.asarray(b.entries, dtype=np.int64).tobytes(),
            np.asarray(b.capacity, dtype=np.int64).tobytes())


def _rankings(rankings: Mapping[str, Any] | None, include: Sequence[str], shape: tuple[int, int],
              seed: int, default_allocation: str) -> dict[str, tuple[np.ndarray, str, dict]]:
    """``{name: (scores [L, H], allocation, meta)}``; ``"headkv"`` alone defaults to
    the proportional (HeadKV) allocation."""
    out: dict[str, tuple[np.ndarray, str, dict]] = {}
    clash = sorted(set(rankings or {}) & set(include))
    if clash:
        raise LocosError(f"ranking name(s) {clash} clash with the built-in controls in "
                         "include=; rename the ranking")
    for name, spec in (rankings or {}).items():
        alloc = "proportional" if name == "headkv" else default_allocation
        if isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], str):
            spec, alloc = spec
        if isinstance(spec, str):
            raise LocosError(f"ranking {name!r}: pass scores, or use include=({spec!r},)")
        arr = as_score_array(spec)
        if arr.shape != shape:
            raise LocosError(f"ranking {name!r} has shape {arr.shape}, the model {shape}")
        out[name] = (arr, alloc, {})
    for name in include:
        if name == "uniform":
            out["uniform"] = (np.zeros(shape), "uniform", {})
        elif name == "random":
            rng = np.random.default_rng(seed)
            out["random"] = (rng.random(shape), default_allocation, {"seed": seed})
        else:
            raise LocosError(f"unknown built-in ranking {name!r}; use 'uniform' or 'random'")
    if not out:
        raise LocosError("no ranking to sweep: pass rankings= or include=")
    return out


def compression_sweep(
    model: Any,
    trials: Sequence[Any],
    rankings: Mapping[str, Any] | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    unit: str = "kv_group",
    include: Sequence[str] = ("uniform", "random"),
    seed: int = 0,
    allocation: str = "greedy",
    sinks: int = 4,
    min_recent: int = 8,
    group_reduce: str = "max",
    max_new_tokens: int = 8,
    stop_rule: str = "newline_token",
    query_start: int | None = None,
    progress: bool = True,
) -> pd.DataFrame:
    """Compressed greedy decoding of every trial under every (ranking, fraction).

    Args:
        model: a TransformerBridge.
        trials: trials with ``meta["query_start"]``.
        rankings: ``{name: scores}`` (HeadScores or ``[n_layers, n_heads]`` arrays) or
            ``{name: (scores, allocation)}``. ``"headkv"`` without an allocation uses
            ``"proportional"`` (HeadKV's published combination), others ``allocation``.
        fractions: retained fractions of the context cache, each in ``(0, 1]`` (as
            ``locos compress --fractions``; a log-scale curve has no 0; repeats are
            dropped). A fraction is of the entries the full cache stores: a
            sliding-window layer stores only its window
            (:func:`~locos_tl.experiments.compress.context_capacity`).
        unit: ``"kv_group"`` or ``"query_head"``.
        include: built-in rankings: ``"uniform"`` (uniform allocation) and
            ``"random"`` (scores drawn with ``seed``, ``allocation``).
        seed: seed of the random ranking (recorded in the ``seed`` column).
        allocation: allocation of every ranking without its own.
        sinks, min_recent, group_reduce: see :func:`~locos_tl.experiments.compress.kv_budgets`.
        max_new_tokens, stop_rule: decoding settings. ``max_new_tokens`` is 8 tokens by
            default, not scoring's 50 (:class:`~locos_tl.engine.options.DecodeOptions`):
            the answers are names and the sweep reads the first token and a whole-word
            match, so more steps through each compressed cache only cost time.
        query_start: the question's first position for trials without
            ``meta["query_start"]`` (negative: counted from the end of the prompt).
        progress: tqdm progress bar.

    Budgets that retain the same positions in every unit (all rankings at the fraction
    1.0) are decoded once per trial; their rows repeat that one result.

    Returns:
        Tidy frame, one row per (ranking, allocation, unit, fraction, trial): ranking,
        allocation, unit, fraction, retained_fraction (measured entries), task, trial
        (id), trial_index, correct (the first response token is a first token of the
        answer: :func:`~locos_tl.experiments.task_metrics.first_token_match`),
        answer_correct (the answer as a whole word in the response, case-sensitive:
        :func:`~locos_tl.experiments.task_metrics.answer_word_match`, not NoLiMa's
        substring ``contains``), output, answer, kv_bytes, full_kv_bytes, context_len,
        retained_entries, full_entries, seed, below_floor (the budget was below the
        sinks + recent floor: every unit kept about the same shrunk window). ``task`` is
        the trial's ``meta["task"]``, ``"(no task)"`` when it has none.

    Raises:
        TrialError: trials without a ``query_start`` inside their prompt, all named in
            one error (:func:`~locos_tl.experiments.methods.check_trials`), or built by
            another tokenizer than the model's
            (:func:`~locos_tl.trials.check_trials_tokenizer`); both before any prefill.
        LocosError: unknown built-in ranking, a ranking of the wrong shape, a fraction
            outside ``(0, 1]`` or none (:func:`~locos_tl.experiments.compress.fractions.
            check_fractions`), a model compressed decoding cannot run (learned attention
            sinks, no HF twin).
    """
    trials = as_trial_list(trials, "compression_sweep")
    check_trials(model, trials, where="compression_sweep", checks=(_query_start_problem,),
                 query_start=query_start)  # every trial, before any prefill
    if isinstance(include, str):
        include = (include,)
    L, H, n_kv = n_heads_of(model)
    ranks = _rankings(rankings, include, (L, H), seed, allocation)
    fractions = check_fractions(fractions)
    compression_twin(model)  # refuses what it cannot run before any prefill
    total = len(trials) * len(ranks) * len(fractions)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="compression sweep", leave=False)
    rows = []
    try:
        for i, trial in enumerate(trials):
            # the trial's own query_start wins; query_start_of reads negatives from the end
            own = trial.meta.get("query_start")
            qs = query_start_of(trial, own if own is not None else query_start)
            full = prefill_context(model, trial, qs)
            capacity = cache_capacity(full, qs)  # sliding-window layers store less
            decoded: dict[tuple, Any] = {}  # one decode per distinct set of positions
            for name, (scores, alloc, meta) in ranks.items():
                for frac in fractions:
                    with warnings.catch_warnings():  # said once, after the sweep
                        warnings.simplefilter("ignore", UserWarning)
                        b = kv_budgets(scores, frac, qs, n_kv, unit=unit, allocation=alloc,
                                       sinks=sinks, min_recent=min_recent,
                                       group_reduce=group_reduce, method=name,
                                       capacity=capacity)
                    key = _budget_key(b)
                    if key not in decoded:
                        decoded[key] = compressed_generate(
                            model, trial, b, max_new_tokens=max_new_tokens,
                            stop_rule=stop_rule, full_cache=full, query_start=qs)
                    r = decoded[key]
                    rows.append({
                        "ranking": name, "allocation": alloc, "unit": unit,
                        "fraction": frac, "retained_fraction": r.retained_fraction,
                        "task": trial.meta.get("task") or "(no task)",
                        "trial": trial.trial_id,
                        "trial_index": i, "correct": r.first_token_correct,
                        "answer_correct": r.answer_correct, "output": r.text,
                        "answer": trial.answer, "kv_bytes": r.kv_bytes,
                        "full_kv_bytes": r.full_kv_bytes, "context_len": qs,
                        "retained_entries": r.retained_entries,
                        "full_entries": r.full_entries, "seed": meta.get("seed"),
                        "below_floor": bool(b.meta.get("below_floor", False)),
                    })
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    df = pd.DataFrame(rows)
    if len(df) and df["below_floor"].any():
        low = sorted(float(f) for f in df.loc[df["below_floor"], "fraction"].unique())
        warn_caller(f"fractions {low} are below the floor of sinks={sinks} + "
                    f"min_recent={min_recent} entries per unit for some trials: there "
                    "every unit keeps about the same shrunk window (column below_floor)",
                    UserWarning)
    return df


def ranking_hash(hs: Any) -> str:
    """SHA-256 (16 hex digits) of a ranking's scores, to tell runs apart."""
    import hashlib

    arr = np.ascontiguousarray(hs.scores.detach().cpu().numpy().astype(np.float64))
    return hashlib.sha256(arr.tobytes()).hexdigest()[:16]
