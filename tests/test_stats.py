"""Public intervals and paired tests (:mod:`locos_tl.experiments.stats`): McNemar and
Wilcoxon against scipy on a hand-made sweep, the protocol's published ``paired.csv``
reproduced from its records, and the bootstrap the protocol shares."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
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
    with pytest.raises(ValueError, match=r"'a' seed 0 lacks 10 \(ut0, ut1, ut2, \.\.\. "
                       r"\(7 more\)\); 'b' seed 0 lacks 10 \(t0, t1, t2, \.\.\."):
        paired_tests(apart, "a", "b")
    elsewhere = records.assign(k=np.where(records["method"] == "b", 10, 5))
    with pytest.raises(ValueError, match="no pairs"):
        paired_tests(elsewhere, "a", "b")


def test_paired_tests_refuse_records_held_twice():
    """Two sweeps' records concatenated: two rows per trial, refused by name (a mean of
    the two would read a ``contains`` of 0.5 as correct and count each trial once)."""
    records, _ = _records()
    twice = pd.concat([records, records], ignore_index=True)
    with pytest.raises(ValueError, match=r"40 \(trial, method, k, seed, metric\) record\(s\) "
                       r"occur in more than one row \(80 rows\): \(trial 't0', method 'a', "
                       r"k 5, seed 0, metric 'contains'\) x2, \(trial 't1'.*\(37 more\)"):
        paired_tests(twice, "a", "b")
    # a resumed run's second half beside its first: other values for the same records
    resumed = pd.concat([records, records[records["trial"] == "t2"].assign(value=1.0)])
    with pytest.raises(ValueError, match=r"^paired_tests: 4 .*\(trial 't2', method 'a', k 5, "
                       r"seed 0, metric 'contains'\) x2, \(trial 't2', method 'a', k 5, "
                       r"seed 0, metric 'name_margin'\) x2, "):
        paired_tests(resumed, "a", "b")


@pytest.mark.parametrize("value", [0.5, float("nan"), 2.0])
def test_paired_tests_refuse_a_contains_that_is_not_0_or_1(value):
    records, _ = _records()
    cell = (records["method"] == "b") & (records["metric"] == "contains")
    bad = records.assign(value=records["value"].mask(cell & (records["trial"] == "t3"), value))
    with pytest.raises(ValueError, match=rf"1 'contains' record\(s\) are not 0 or 1: \(trial "
                       rf"'t3', method 'b', k 5, seed 0\) {value}\."):
        paired_tests(bad, "a", "b")


def test_paired_tests_refuse_different_trials_by_name():
    """Pairs are by trial id: a side (or a seed of ``b``) lacking trials is an error that
    names them, not an inner join."""
    records, _ = _records()
    fewer = records[~((records["method"] == "b") & records["trial"].isin(["t8", "t9"]))]
    with pytest.raises(ValueError, match=r"at k=5 the 'contains' records of 'a' and 'b' are "
                       r"not over the same trials: 'b' seed 0 lacks 2 \(t8, t9\)\. "):
        paired_tests(fewer, "a", "b")
    both = fewer[~((fewer["method"] == "a") & (fewer["trial"] == "t0"))]
    with pytest.raises(ValueError, match=r"'a' seed 0 lacks 1 \(t0\); 'b' seed 0 lacks 2 "
                       r"\(t8, t9\)"):
        paired_tests(both, "a", "b")
    # a second seed of b over fewer trials than its first
    seed1 = records[(records["method"] == "b") & (records["trial"] != "t4")].assign(seed=1)
    with pytest.raises(ValueError, match=r"'b' seed 1 lacks 1 \(t4\)\. "):
        paired_tests(pd.concat([records, seed1]), "a", "b")
    # the name margin, where both have one, on the same trials as well
    no_margin = (records["method"] == "a") & (records["metric"] == "name_margin")
    with pytest.raises(ValueError, match=r"the 'name_margin' records of 'a' and 'b' are not "
                       r"over the same trials: 'a' seed 0 lacks 1 \(t5\)"):
        paired_tests(records[~(no_margin & (records["trial"] == "t5"))], "a", "b")


def test_identical_rankings_give_p_1_exactly():
    """A ranking against three seeds equal to itself: no difference, p = 1 for both tests,
    though ``(u + u + u) / 3 != u`` in floating point for some of the margins."""
    contains = [1, 0, 1, 1, 0, 1, 0, 1, 1, 1]
    margins = [0.1 + 0.2, 0.1, 0.36, 0.95, -0.7, 0.35, 2.675, -0.74, 1.35, 0.05]
    assert sum((u + u + u) / 3 != u for u in margins) >= 5  # the case this tests
    rows = [{"method": m, "k": 5, "seed": s, "trial": f"t{i}", "metric": metric,
             "value": float(v[i])}
            for m, seeds in (("locos", [0]), ("random", [0, 1, 2])) for s in seeds
            for metric, v in (("contains", contains), ("name_margin", margins))
            for i in range(10)]
    row = paired_tests(pd.DataFrame(rows), "locos", "random").iloc[0]
    assert row["p_mcnemar"] == 1.0 and row["p_wilcoxon"] == 1.0
    assert (row["n_only_a"], row["n_only_b"], row["n_pairs_margin"]) == (0, 0, 10)
    assert row["name_margin_against"] == row["name_margin"] == np.mean(margins)


def test_protocol_bootstrap_is_the_public_one():
    from locos_tl.experiments.protocol.common import _bootstrap

    v = np.random.default_rng(1).random(30)
    assert _bootstrap(v) == bootstrap_ci(v) == bootstrap_ci(v, 0.95, 0)
    lo, hi = bootstrap_ci(v, 0.5)
    assert bootstrap_ci(v)[0] <= lo < v.mean() < hi <= bootstrap_ci(v)[1]
    assert bootstrap_ci(np.ones(4)) == (1.0, 1.0)


def _mlp_table() -> pd.DataFrame:
    """:func:`summarize_mlp_patching`'s input: one position set and layer, 6 trials."""
    from locos_tl.experiments.cross_model import COLUMNS

    rng = np.random.default_rng(2)
    return pd.DataFrame({c: rng.normal(size=6) for c in COLUMNS}).assign(
        trial_id=[f"t{i}" for i in range(6)], positions="all", layer=0, n_positions=3)


@pytest.mark.parametrize("level", [95, -0.5, 0, 1, float("nan"), True], ids=repr)
def test_every_confidence_level_is_checked_one_way(level):
    """Each public function taking a confidence level refuses one outside (0, 1) with the
    same ValueError (95 gave NaN bounds, -0.5 an inverted interval)."""
    from locos_tl.experiments.cross_model import summarize_mlp_patching
    from locos_tl.experiments.evaluate import ablation_sweep
    from locos_tl.experiments.stats import check_confidence
    from locos_tl.heads import HeadScores

    def message(name: str) -> str:
        return re.escape(f"{name} must be a confidence level in (0, 1), such as 0.95; "
                         f"got {level!r}")

    v = np.random.default_rng(1).random(30)
    with pytest.raises(ValueError, match=message("confidence")):
        check_confidence(level)
    with pytest.raises(ValueError, match=message("confidence")):
        bootstrap_ci(v, level)
    with pytest.raises(ValueError, match=message("confidence")):
        bootstrap_ci(np.ones(3), confidence=level)  # no resampling needed: still checked
    with pytest.raises(ValueError, match=message("confidence")):
        summarize_mlp_patching(_mlp_table(), confidence=level)
    scores = HeadScores("locos", torch.randn(5, 2, 3, generator=torch.Generator().manual_seed(0)))
    with pytest.raises(ValueError, match=message("level")):
        scores.bootstrap_ci(level=level)
    with pytest.raises(ValueError, match=message("ci")):  # checked before any model work
        ablation_sweep(None, [], {}, ci=level)


def test_a_confidence_level_in_range_is_used():
    from locos_tl.experiments.cross_model import summarize_mlp_patching
    from locos_tl.experiments.stats import check_confidence

    assert check_confidence(np.float64(0.9)) == 0.9 and check_confidence(0.5, "ci") == 0.5
    df = _mlp_table()
    row = summarize_mlp_patching(df, confidence=0.9).iloc[0]
    assert (row["margin_low"], row["margin_high"]) == bootstrap_ci(df["margin"], 0.9)
    assert row["margin_low"] < row["margin"] < row["margin_high"]


def test_exported():
    import locos_tl
    import locos_tl.experiments

    assert locos_tl.paired_tests is paired_tests is locos_tl.experiments.paired_tests


@pytest.fixture(scope="module")
def published_onehop():
    """The published SmolLM2 (NoLiMa organism) one-hop sweep's per-trial records,
    scored on its trials rebuilt as the protocol's ``trials`` stage does (needs the
    model's tokenizer in the local cache)."""
    from test_real_models import require_fetched

    from locos_tl.data import (
        build_nolima_trials,
        expand_needle_set,
        load_haystacks,
        load_needle_set,
    )
    from locos_tl.data.hub import load_tokenizer
    from locos_tl.data.packaged import resolve_data_dir
    from locos_tl.data.prompt import PromptBuilder
    from locos_tl.experiments.protocol.common import EVAL_DEPTHS, EVAL_SEED, _names
    from locos_tl.experiments.protocol.config import ProtocolConfig
    from locos_tl.experiments.protocol.stages import needle_sets
    from locos_tl.experiments.run_table import load_ablation_sweep
    from locos_tl.models.zoo import ELICITED_MODELS

    args = ProtocolConfig.from_settings(json.loads((PUBLISHED / "args.json").read_text()))
    elicited = ELICITED_MODELS.get(args.model)
    require_fetched(elicited.base if elicited else args.model)  # the base's tokenizer
    tok = load_tokenizer(args.model)
    books, _ = resolve_data_dir(None)
    hay = load_haystacks([books / "mohicans_part1.txt", books / "mohicans_part2.txt"])
    items = expand_needle_set(load_needle_set(needle_sets(args)[1]), ["onehop"])
    trials = build_nolima_trials(tok, [_names(i, 1) for i in items], hay, lengths=[1000],
                                 depths=EVAL_DEPTHS, num_examples=args.n_eval,
                                 chat_template=args.template == "chat", seed=EVAL_SEED,
                                 builder=PromptBuilder(tok), template="default",
                                 distractors=args.distractors)
    return load_ablation_sweep(PUBLISHED / "ablate" / "onehop_1000", trials, per_trial=True)


def test_paired_tests_reproduce_the_published_paired_csv(published_onehop):
    from locos_tl.experiments.methods import current_name
    from locos_tl.experiments.protocol.paired import paired_table

    want = pd.read_csv(PUBLISHED / "paired.csv")  # Wu's ranking is wu_nolima there
    want[["method", "against"]] = want[["method", "against"]].map(current_name)
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
