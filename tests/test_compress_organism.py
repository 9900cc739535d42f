"""KV compression on the shipped organism (data/organisms/retrieval-2l, 128 tokens):
keeping the non-literal writers' cache keeps non-literal accuracy, keeping only the
literal copy heads' cache loses it (and the reverse for literal); the sweep's frame."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from locos_tl.engine.decode import greedy_decode
from locos_tl.experiments.compress import compressed_generate, compression_sweep, kv_budgets
from locos_tl.experiments.compress.generate import n_heads_of

ORG = Path(__file__).resolve().parents[1] / "data" / "organisms" / "retrieval-2l"


@pytest.fixture(scope="module")
def ground_truth():
    return json.loads((ORG / "ground_truth.json").read_text())


def _scores(heads, L, H):
    s = np.zeros((L, H))
    for l, h in heads:
        s[l, h] = 1.0
    return s


def _one_full_unit_fraction(n_units: int, qs: int, floor: int = 12) -> float:
    """The fraction at which greedy keeps exactly one unit full, the others the floor."""
    return (qs + (n_units - 1) * floor) / (n_units * qs)


def test_full_budget_decodes_and_stops_as_greedy_decode(organism):
    """With every unit full, the compressed decode is ``greedy_decode`` with the same
    stop rules: tokens, response, stop (the organism ends its answers with EOS)."""
    from locos_tl.organisms.tasks import make_trials

    L, H, n_kv = n_heads_of(organism)
    trials = make_trials("nonliteral", 3, 128, seed=7) + make_trials("literal", 2, 128, seed=7)
    stops = set()
    for t in trials:
        qs = int(t.meta["query_start"])
        b = kv_budgets(np.zeros((L, H)), 1.0, qs, n_kv)
        got = compressed_generate(organism, t, b, max_new_tokens=8)
        ref = greedy_decode(organism, t.tokens, max_new_tokens=8)
        assert (got.tokens, got.text, got.stopped_by) == (ref.generated, ref.text,
                                                          ref.stopped_by), t.trial_id
        assert got.first_token == ref.generated[ref.response_start]
        stops.add(got.stopped_by)
    assert stops == {"eos"}  # the comparison covers a stop, not only the budget


def test_writers_cache_keeps_nonliteral_copy_cache_does_not(organism, ground_truth):
    from locos_tl.organisms.tasks import make_trials

    L, H, n_kv = n_heads_of(organism)
    G = H // n_kv
    # the ground-truth sets sit in different kv groups of layer 1
    assert {(l, h // G) for l, h in ground_truth["nonliteral_writer"]} == {(1, 0)}
    assert {(l, h // G) for l, h in ground_truth["literal_copy"]} == {(1, 1)}
    acc = {}
    for task in ("nonliteral", "literal"):
        trials = make_trials(task, 20, 128, seed=7)
        for name in ("nonliteral_writer", "literal_copy"):
            s = _scores(ground_truth[name], L, H)
            hits = []
            for t in trials:
                qs = t.meta["query_start"]
                assert qs == t.n_tokens - 2
                b = kv_budgets(s, _one_full_unit_fraction(L * n_kv, qs), qs, n_kv)
                assert b.is_full().sum() == 1 and b.is_full()[1, 0 if name[0] == "n" else 1]
                hits.append(compressed_generate(organism, t, b, max_new_tokens=2)
                            .first_token_correct)
            acc[task, name] = float(np.mean(hits))
    # measured: nonliteral 0.85 (writers) vs 0.10 (copy); literal 1.0 (copy) vs 0.10
    assert acc["nonliteral", "nonliteral_writer"] >= 0.75
    assert acc["nonliteral", "nonliteral_writer"] - acc["nonliteral", "literal_copy"] >= 0.5
    assert acc["literal", "literal_copy"] >= 0.9
    assert acc["literal", "literal_copy"] - acc["literal", "nonliteral_writer"] >= 0.5


def test_sweep_frame_prefills_once(organism, ground_truth, monkeypatch):
    from locos_tl.experiments.compress import sweep as sweep_mod
    from locos_tl.organisms.tasks import make_trials

    trials = make_trials("nonliteral", 3, 64, seed=3) + make_trials("literal", 3, 64, seed=3)
    calls = []
    real = sweep_mod.prefill_context
    monkeypatch.setattr(sweep_mod, "prefill_context",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    L, H, _ = n_heads_of(organism)
    writers = _scores(ground_truth["nonliteral_writer"], L, H)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        df = compression_sweep(organism, trials, {"writers": writers, "headkv": writers},
                               fractions=(0.05, 0.5, 1.0), include=("uniform", "random"),
                               seed=5, max_new_tokens=2, progress=False)
    assert len(calls) == len(trials)  # one prefill per trial
    assert len(df) == len(trials) * 4 * 3
    for col in ("ranking", "allocation", "unit", "fraction", "retained_fraction", "task",
                "trial", "correct", "output", "answer", "kv_bytes", "full_kv_bytes",
                "context_len"):
        assert col in df.columns
    alloc = df.groupby("ranking")["allocation"].first().to_dict()
    assert alloc == {"writers": "greedy", "headkv": "proportional", "uniform": "uniform",
                     "random": "greedy"}
    assert (df.loc[df.ranking == "random", "seed"] == 5).all()
    # 0.05 of a 62-token context is below the 12-entry floor: flagged and warned once
    assert df.loc[df.fraction == 0.05, "below_floor"].all()
    assert sum("below the floor" in str(x.message) for x in w) == 1
    full = df[df.fraction == 1.0]
    assert (full.kv_bytes == full.full_kv_bytes).all()
    assert (df[df.fraction == 0.5].kv_bytes < df[df.fraction == 0.5].full_kv_bytes).all()
    assert np.allclose(df.retained_fraction, df.fraction, atol=1 / (4 * 62))
    # the 100 % rows are plain greedy decoding
    for i, t in enumerate(trials):
        ref = greedy_decode(organism, list(t.tokens), max_new_tokens=2)
        assert set(full[full.trial_index == i].output) == {ref.text}


def test_sweep_decodes_each_distinct_budget_once(organism, ground_truth, monkeypatch):
    """Budgets that keep the same positions (every ranking at 1.0) are decoded once a
    trial, and the rows equal a sweep that decodes every (ranking, fraction) apart."""
    from locos_tl.experiments.compress import sweep as sweep_mod
    from locos_tl.organisms.tasks import make_trials

    trials = make_trials("nonliteral", 2, 64, seed=4)
    L, H, _ = n_heads_of(organism)
    rankings = {"writers": _scores(ground_truth["nonliteral_writer"], L, H),
                "copy": _scores(ground_truth["literal_copy"], L, H)}
    fractions = (0.5, 1.0)
    calls = []
    real = sweep_mod.compressed_generate
    monkeypatch.setattr(sweep_mod, "compressed_generate",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    df = compression_sweep(organism, trials, rankings, fractions, include=("uniform",),
                           max_new_tokens=2, progress=False)
    monkeypatch.setattr(sweep_mod, "compressed_generate", real)
    # per trial: the 3 rankings keep different heads at 0.5, and 1.0 is one full cache
    # for all of them (4 decodes, not 6)
    assert len(calls) == len(trials) * (3 + 1)
    assert len(df) == len(trials) * 3 * 2
    cols = ["output", "correct", "answer_correct", "retained_entries", "kv_bytes"]
    for name in ("writers", "copy", "uniform"):
        for frac in fractions:
            one = compression_sweep(
                organism, trials, {name: rankings[name]} if name in rankings else None,
                (frac,), include=("uniform",) if name == "uniform" else (),
                max_new_tokens=2, progress=False)
            got = df[(df.ranking == name) & (df.fraction == frac)]
            pd.testing.assert_frame_equal(got[cols].reset_index(drop=True),
                                          one[cols].reset_index(drop=True))


def test_sweep_takes_query_start_for_trials_without_it(organism):
    """``query_start=-2`` on trials stripped of ``meta["query_start"]`` gives the same
    frame as the organism's own meta (the question is the last two tokens)."""
    import dataclasses

    from locos_tl.errors import TrialError
    from locos_tl.organisms import make_trials

    trials = make_trials("nonliteral", 2, 96, seed=3)
    bare = [dataclasses.replace(t, meta={k: v for k, v in t.meta.items()
                                         if k != "query_start"}) for t in trials]
    kw = {"fractions": (0.3,), "include": ("uniform",), "progress": False}
    a = compression_sweep(organism, trials, **kw)
    b = compression_sweep(organism, bare, query_start=-2, **kw)
    cols = ["output", "correct", "retained_entries", "kv_bytes", "context_len"]
    pd.testing.assert_frame_equal(a[cols], b[cols])
    assert (b["context_len"] == 94).all()
    with pytest.raises(TrialError, match="query_start"):
        compression_sweep(organism, bare, **kw)


def test_sweep_refuses_a_ranking_named_like_a_control(organism):
    from locos_tl.errors import LocosError
    from locos_tl.organisms import make_trials

    trials = make_trials("literal", 1, 96, seed=3)
    L, H, _ = n_heads_of(organism)
    with pytest.raises(LocosError, match="clash with the built-in controls"):
        compression_sweep(organism, trials, {"uniform": np.ones((L, H))}, (0.5,),
                          include=("uniform",), progress=False)
    df = compression_sweep(organism, trials, None, (0.5,), include="uniform", progress=False)
    assert list(df["ranking"]) == ["uniform"]  # a bare string is one control, not letters


@pytest.mark.parametrize("fractions", [(0.0, 0.5), (1.5,), ()])
def test_sweep_refuses_fractions_the_cli_refuses(organism, fractions):
    """The API takes the fractions `locos compress --fractions` takes: each in (0, 1]."""
    from locos_tl.errors import LocosError
    from locos_tl.organisms import make_trials

    trials = make_trials("literal", 1, 96, seed=3)
    with pytest.raises(LocosError, match=r"fractions must each lie in \(0, 1\]"):
        compression_sweep(organism, trials, None, fractions, include="uniform",
                          progress=False)
