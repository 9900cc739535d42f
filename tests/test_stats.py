"""Public intervals and paired tests (:mod:`locos_tl.experiments.stats`): McNemar and
Wilcoxon against scipy on a hand-made sweep, the protocol's published ``paired.csv``
reproduced from its records, and the bootstrap the protocol shares."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest, wilcoxon

from locos_tl.experiments.stats import bootstrap_ci, paired_tests

PUBLISHED = Path(__file__).resolve().parents[1] / "docs" / "real_models" / "smollm2-nolima"


def _records() -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """10 trials: a answers 2 that b misses, b answers 5 that a misses, 3 both (7
    discordant pairs); name margins in nats."""
    a = np.array([1, 1, 0, 0, 0, 0, 0, 1, 1, 1], float)
    b = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1], float)
    ma = np.array([0.5, 2.0, -1.0, 3.5, 0.1, -2.2, 1.7, 0.3, 4.0, -0.6])
    mb = np.array([0.2, 1.1, 0.4, 2.9, 1.3, -0.5, 2.5, 0.8, 3.1, 0.9])
    rows = [{"method": m, "k": 5, "seed": 0, "trial": f"t{i}", "metric": metric,
             "value": float(v[i])}
            for m, c, mm in (("a", a, ma), ("b", b, mb))
            for metric, v in (("contains", c), ("name_margin", mm)) for i in range(10)]
    return pd.DataFrame(rows), {"a": a, "b": b, "ma": ma, "mb": mb}


def test_paired_tests_equal_scipy_on_a_hand_made_sweep():
    records, v = _records()
    row = paired_tests(records, "a", "b").iloc[0]
    assert (row["method"], row["against"], row["k"], row["n_pairs"]) == ("a", "b", 5, 10)
    assert (row["n_only_a"], row["n_only_b"]) == (2, 5)
    assert row["p_mcnemar"] == binomtest(2, 7, 0.5).pvalue
    assert row["contains"] == 0.5 and row["contains_against"] == 0.8
    assert row["n_pairs_margin"] == 10
    assert row["p_wilcoxon"] == wilcoxon(v["ma"] - v["mb"]).pvalue
    assert row["name_margin"] == pytest.approx(v["ma"].mean())
    # symmetric McNemar; one k asked for; no name margin: NaN
    assert paired_tests(records, "b", "a", k=5).iloc[0]["p_mcnemar"] == row["p_mcnemar"]
    only = paired_tests(records[records["metric"] == "contains"], "a", "b").iloc[0]
    assert np.isnan(only["p_wilcoxon"]) and only["n_pairs_margin"] == 0


def test_paired_tests_refuse_what_has_no_pairs():
    records, _ = _records()
    with pytest.raises(ValueError, match="'c' is not in the records"):
        paired_tests(records, "a", "c")
    with pytest.raises(ValueError, match="k=10 is not a head count both"):
        paired_tests(records, "a", "b", k=10)
    with pytest.raises(ValueError, match="lack column"):
        paired_tests(records.drop(columns="trial"), "a", "b")
    apart = records.assign(trial=np.where(records["method"] == "b", "u" + records["trial"],
                                          records["trial"]))
    with pytest.raises(ValueError, match="no pairs"):
        paired_tests(apart, "a", "b")
    elsewhere = records.assign(k=np.where(records["method"] == "b", 10, 5))
    with pytest.raises(ValueError, match="no pairs"):
        paired_tests(elsewhere, "a", "b")


def test_protocol_bootstrap_is_the_public_one():
    from locos_tl.experiments.protocol.common import _bootstrap

    v = np.random.default_rng(1).random(30)
    assert _bootstrap(v) == bootstrap_ci(v) == bootstrap_ci(v, 0.95, 0)
    lo, hi = bootstrap_ci(v, 0.5)
    assert bootstrap_ci(v)[0] <= lo < v.mean() < hi <= bootstrap_ci(v)[1]
    assert bootstrap_ci(np.ones(4)) == (1.0, 1.0)


def test_exported():
    import locos_tl
    import locos_tl.experiments

    assert locos_tl.paired_tests is paired_tests is locos_tl.experiments.paired_tests


@pytest.fixture(scope="module")
def published_onehop():
    """The published SmolLM2 (NoLiMa organism) one-hop sweep's per-trial records,
    scored on its trials rebuilt as the protocol's ``trials`` stage does (needs the
    model's tokenizer in the local cache)."""
    from locos_tl.data import (
        build_nolima_trials,
        expand_needle_set,
        load_haystacks,
        load_needle_set,
    )
    from locos_tl.data.packaged import resolve_data_dir
    from locos_tl.data.prompt import PromptBuilder
    from locos_tl.experiments.protocol.common import EVAL_DEPTHS, EVAL_SEED, _names
    from locos_tl.experiments.protocol.stages import needle_sets
    from locos_tl.experiments.run_table import load_evaluation

    args = Namespace(**json.loads((PUBLISHED / "args.json").read_text()))
    try:
        from locos_tl.data.hub import load_tokenizer

        tok = load_tokenizer(args.model)
    except Exception as exc:  # noqa: BLE001  (not fetched here: nothing to compare)
        pytest.skip(f"the {args.model} tokenizer is not available: {exc}")
    books, _ = resolve_data_dir(None)
    hay = load_haystacks([books / "mohicans_part1.txt", books / "mohicans_part2.txt"])
    items = expand_needle_set(load_needle_set(needle_sets(args)[1]), ["onehop"])
    trials = build_nolima_trials(tok, [_names(i, 1) for i in items], hay, lengths=[1000],
                                 depths=EVAL_DEPTHS, num_examples=args.n_eval,
                                 chat_template=args.template == "chat", seed=EVAL_SEED,
                                 builder=PromptBuilder(tok), template="default",
                                 distractors=args.distractors)
    return load_evaluation(PUBLISHED / "ablate" / "onehop_1000", trials, per_trial=True)


def test_paired_tests_reproduce_the_published_paired_csv(published_onehop):
    from locos_tl.experiments.protocol.paired import paired_table

    want = pd.read_csv(PUBLISHED / "paired.csv")
    want = want[(want["question"] == "onehop") & (want["length"] == 1000)]
    ref = want.set_index(["method", "against", "k"]).loc[("locos", "random", 5)]
    row = paired_tests(published_onehop, "locos", "random", k=5).iloc[0]
    assert row["n_pairs"] == ref["n_trials"] == 60
    for col in ("contains", "contains_against", "p_mcnemar", "name_margin",
                "name_margin_against", "p_wilcoxon"):
        assert row[col] == pytest.approx(ref[col], rel=1e-12, abs=1e-15), col
    assert row["p_mcnemar"] == binomtest(int(row["n_only_a"]), int(row["n_only_a"]
                                         + row["n_only_b"]), 0.5).pvalue
    # the protocol's whole table, now computed by paired_tests' code, is unchanged
    got = paired_table(published_onehop)
    pd.testing.assert_frame_equal(got.reset_index(drop=True),
                                  want.drop(columns=["question", "length"])
                                  .reset_index(drop=True), check_dtype=False, rtol=1e-12)
