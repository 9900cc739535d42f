"""One head parser (locos_tl.head_spec) and every public entry point that takes heads or
head counts k: malformed input is refused with a message naming the accepted forms."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from locos_tl import HeadScores, LocosError, Trial, plot
from locos_tl.errors import HeadSpecError
from locos_tl.head_spec import as_int, parse_head, parse_head_list, parse_heads, parse_ks

REPO = Path(__file__).resolve().parents[1]
ORGANISM = REPO / "data" / "organisms" / "retrieval-2l"  # 2 layers x 8 heads
FORMS = r"\(layer, head\) pair.*'L1H2'.*'1-2'"  # the accepted forms, in every message


# -- the parser ----------------------------------------------------------------------
@pytest.mark.parametrize("item, expected", [
    ((1, 2), (1, 2)),
    ([1, 2], (1, 2)),
    ((np.int64(1), np.int32(2)), (1, 2)),
    ((torch.tensor(1), torch.tensor(2)), (1, 2)),
    (np.array([1, 2]), (1, 2)),
    (torch.tensor([1, 2]), (1, 2)),
    ("L1H2", (1, 2)),
    ("l1h2", (1, 2)),
    (" L1H2 ", (1, 2)),
    ("L02H03", (2, 3)),
    ("1-2", (1, 2)),
    ("2-3", (2, 3)),  # the last head of a 3 x 4 model
    ("0-0", (0, 0)),
    ((0, 0), (0, 0)),
])
def test_parse_head_accepts(item, expected) -> None:
    got = parse_head(item, n_layers=3, n_heads=4)
    assert got == expected
    assert all(type(x) is int for x in got)


@pytest.mark.parametrize("item", [
    "12", "L-1H0", "L1H-2", "1.5-2", "-1-2", "1--2", "L1H", "H1L2", "L1 H2", "1_2", "", "1-2-3",
    "(1, 2)", "L1.0H2", (1.7, 2), (1.0, 2), (1, 2.0), (True, 1), (1, False),
    (np.float64(1), 2), (torch.tensor(1.0), 2), (torch.tensor(True), 1), ("1", "2"),
    (1, 2, 3), (1,), (), 1, 1.5, None, {"layer": 1, "head": 2}, b"L1H2",
    np.array([1.0, 2.0]), np.array(3),
])
def test_parse_head_rejects_malformed(item) -> None:
    with pytest.raises(HeadSpecError, match=FORMS) as exc:
        parse_head(item, n_layers=3, n_heads=4, what="head")
    assert isinstance(exc.value, LocosError) and isinstance(exc.value, ValueError)
    assert repr(item)[:8] in str(exc.value)  # names the offending item


@pytest.mark.parametrize("item, msg", [
    ((-1, 0), "non-negative"),
    ((0, -1), "non-negative"),
    ((3, 0), r"head \(3, 0\) is outside the model's 3 layers x 4 heads \(layer 0..2, head 0..3\)"),
    ((0, 4), r"head \(0, 4\) is outside"),
    ("L3H0", r"head \(3, 0\) is outside"),
    ("0-4", r"head \(0, 4\) is outside"),
])
def test_parse_head_rejects_out_of_range(item, msg) -> None:
    with pytest.raises(HeadSpecError, match=msg):
        parse_head(item, n_layers=3, n_heads=4)


def test_parse_head_without_geometry_checks_only_sign() -> None:
    assert parse_head("L99H7") == (99, 7)
    with pytest.raises(HeadSpecError, match="non-negative"):
        parse_head((-1, 0))


@pytest.mark.parametrize("heads, msg", [
    (None, "got None"),
    ("L1H2", r"got the string 'L1H2' \(wrap one head in a list: \['L1H2'\]\)"),
    ((1, 2), r"got a single pair \(1, 2\); to name one head write \[\(1, 2\)\]"),
    ([1, 2], r"got a single pair \(1, 2\)"),
    (HeadScores("locos", torch.zeros(1, 2, 2)), r"got a HeadScores; .*top_k\(10\)"),
    ({(0, 1): 1.0}, "got dict"),
    (5, "got int 5"),
])
def test_parse_heads_rejects_non_collections(heads, msg) -> None:
    with pytest.raises(HeadSpecError, match=r"heads must be a list of heads.*" + msg):
        parse_heads(heads)


def test_parse_heads_order_position_and_repeats() -> None:
    got = parse_heads([(2, 0), "L0H3", "1-1", np.array([0, 0])], n_layers=3, n_heads=4)
    assert got == [(2, 0), (0, 3), (1, 1), (0, 0)]  # order kept: a ranking stays a ranking
    assert parse_heads([]) == [] and parse_heads(iter([(0, 1)])) == [(0, 1)]
    with pytest.raises(HeadSpecError, match=r"heads\[2\] = '12' is not a head"):
        parse_heads([(0, 0), "L0H1", "12"])
    assert parse_heads([(0, 1), "0-1"]) == [(0, 1), (0, 1)]
    with pytest.raises(HeadSpecError, match=r"heads\[1\]: head \(0, 1\) is listed twice"):
        parse_heads([(0, 1), "0-1"], unique=True)


def test_parse_heads_reads_the_geometry_of_a_model() -> None:
    class Cfg:
        n_layers, n_heads = 2, 8

    class Bridge:
        cfg = Cfg()

    assert parse_heads(["L1H7"], Bridge()) == [(1, 7)]
    with pytest.raises(HeadSpecError, match="2 layers x 8 heads"):
        parse_heads(["L2H0"], Bridge())
    with pytest.raises(HeadSpecError, match="cannot read n_layers"):
        parse_heads([], object())


def test_parse_head_list() -> None:
    assert parse_head_list("L1H2, 0-3") == [(1, 2), (0, 3)]
    with pytest.raises(HeadSpecError, match="names no head"):
        parse_head_list(" , ")
    with pytest.raises(HeadSpecError, match=r"\[1\] = '' is not a head"):
        parse_head_list("L1H2,,0-1")


def test_parse_ks_and_as_int() -> None:
    assert parse_ks(5, n_total=16) == [5]
    assert parse_ks([5, 1, 5, np.int64(16)], n_total=16) == [1, 5, 16]
    assert parse_ks([0, 3], allow_zero=True) == [0, 3]
    with pytest.raises(HeadSpecError, match=r"k = 0 is out of range: each k must be in "
                                            r"1..16 .*'baseline'"):
        parse_ks([0, 4], n_total=16)
    with pytest.raises(HeadSpecError, match=r"k = 99999 is more heads than the model has: "
                                            r"each k must be in 1..16"):
        parse_ks([99999], n_total=16)
    with pytest.raises(HeadSpecError, match="k = 20 is more heads"):
        parse_ks([4, 16, 20], n_total=16)
    for bad in (1.5, [2.0], [True], "1,2", None):
        with pytest.raises(HeadSpecError, match="k must be an int"):
            parse_ks(bad)
    with pytest.raises(HeadSpecError, match="names no head count"):
        parse_ks([])
    assert as_int(np.int16(3), "x") == 3
    for bad in (True, 3.0, "3", np.float32(3), torch.tensor(3.0), torch.tensor([1, 2])):
        with pytest.raises(HeadSpecError, match="x must be an integer"):
            as_int(bad, "x")


# -- entry points --------------------------------------------------------------------
@pytest.fixture(scope="module")
def org_trials(organism) -> list[Trial]:
    g = torch.Generator().manual_seed(0)
    V = int(organism.cfg.d_vocab)
    return [Trial(tokens=torch.randint(4, V - 1, (24,), generator=g).tolist(),
                  needle_span=(5, 9), answer="x", trial_id=f"t{i}") for i in range(2)]


def test_ablate_parses_every_form_and_refuses_malformed(organism) -> None:
    from locos_tl import ablate

    ids = torch.tensor([list(range(4, 20))])
    with torch.no_grad():
        clean = organism(ids)
        outs = []
        for form in ([(1, 2)], ["L1H2"], ["1-2"], [np.array([1, 2])]):
            with ablate(organism, form, "query_zero"):
                outs.append(organism(ids))
        with ablate(organism, [(1, 3)], "query_zero"):
            other = organism(ids)
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=0, atol=0)
    assert not torch.allclose(outs[0], clean)  # the hook acted
    assert not torch.allclose(outs[0], other)  # ... on head 2, not head 3
    # "12" used to hook layer 1 head 2; (1.7, 2) used to become (1, 2)
    for bad, msg in ((["12"], "'12' is not a head"), ([(1.7, 2)], r"\(1.7, 2\) is not a head"),
                     ([(-1, 0)], "non-negative"), ([(2, 0)], "outside the model's 2 layers")):
        with pytest.raises(HeadSpecError, match=msg):
            with ablate(organism, bad, "query_zero"):
                pytest.fail("the block ran")
    with torch.no_grad():  # nothing left attached by the refused calls
        torch.testing.assert_close(organism(ids), clean, rtol=0, atol=0)


def test_random_heads_exclude_and_top_k(organism) -> None:
    from locos_tl import random_heads

    drawn = random_heads(2, 8, 15, seed=0, exclude=["L0H0"])
    assert (0, 0) not in drawn and len(set(drawn)) == 15
    assert random_heads(2, 8, 15, seed=0, exclude=[(0, 0)]) == drawn
    with pytest.raises(HeadSpecError, match=r"exclude\[0\] = \(0.5, 0\) is not a head"):
        random_heads(2, 8, 1, seed=0, exclude=[(0.5, 0)])
    hs = HeadScores("locos", torch.arange(16.0).reshape(1, 2, 8))
    assert hs.top_k(2) == [(1, 7), (1, 6)]
    with pytest.raises(HeadSpecError, match="k must be >= 0, got -1"):
        hs.top_k(-1)  # used to return every head but the last


def _no_generation(monkeypatch) -> None:
    monkeypatch.setattr(sys.modules["locos_tl.experiments.evaluate"], "greedy_decode",
                        lambda *a, **k: pytest.fail("generation started"))


@pytest.mark.parametrize("head_sets, k, msg", [
    ({"m": ["12"]}, [1], r"head_sets\['m'\]\[0\] = '12' is not a head; .*" + FORMS),
    ({"m": [(1.7, 2)]}, [1], r"head_sets\['m'\]\[0\] = \(1.7, 2\) is not a head"),
    ({"m": [(0, 1), "0-1"]}, [1], r"head_sets\['m'\]\[1\]: head \(0, 1\) is listed twice"),
    ({"m": (0, 1)}, [1], r"got a single pair \(0, 1\)"),
    ({"m": "L0H1"}, [1], "got the string 'L0H1'"),
    ({"m": [(0, 0)]}, [0], r"k = 0 is out of range: each k must be in 1..16"),
    ({"m": [(0, 0)]}, [99999], r"k = 99999 is more heads than the model has: .*1..16"),
    ({"m": [(0, 0)]}, [4, 16, 20], r"k = 20 is more heads than the model has"),
])
def test_evaluate_refuses_before_generation(organism, org_trials, monkeypatch, tmp_path,
                                            head_sets, k, msg) -> None:
    from locos_tl import ablation_sweep

    _no_generation(monkeypatch)
    with pytest.raises(HeadSpecError, match=msg):
        ablation_sweep(organism, org_trials, head_sets, k=k, mode="query_zero", progress=False,
                 out_dir=tmp_path)
    assert not (tmp_path / "meta.json").exists()  # nothing recorded for a refused run


def test_evaluate_head_forms_default_k_and_skipped_k(organism, org_trials, tmp_path) -> None:
    from locos_tl import ablation_sweep
    from locos_tl.experiments.ablation_plan import build_jobs

    # string forms give the same cells as tuples
    a = build_jobs({"m": ["L1H2", "0-5", (1, 0)]}, [1, 2, 3], n_layers=2, n_heads=8)
    b = build_jobs({"m": [(1, 2), (0, 5), (1, 0)]}, [1, 2, 3], n_layers=2, n_heads=8)
    assert a == b and {j.heads for j in a if j.method == "m"} == {
        ((1, 2),), ((1, 2), (0, 5)), ((1, 2), (0, 5), (1, 0))}

    # default k: the paper's (1, 5, 10, 20, 50, 100) up to the model's 16 heads
    with pytest.warns(UserWarning, match=r"head set 'm' lists fewer heads than k=\[5, 10\]"):
        df = ablation_sweep(organism, org_trials[:1], {"m": ["L1H2", "0-5"]}, mode="query_zero",
                      seeds=0, bottom=None, max_new_tokens=1, progress=False, out_dir=tmp_path)
    meta = json.loads((tmp_path / "meta.json").read_text())["settings"]
    assert meta["ks"] == [1, 5, 10] and meta["seeds"] == [0]
    assert meta["skipped_k"] == {"m": [5, 10]}  # recorded, not silently dropped
    cells = set(zip(df["method"], df["k"], strict=True))
    assert cells == {("baseline", 0), ("m", 1), ("random", 1), ("random", 5), ("random", 10)}
    assert meta["head_sets"][next(k for k, v in meta["head_sets"].items()
                                  if v == [[1, 2]])] == [[1, 2]]


def test_score_trials_methods_as_one_string(organism, org_trials) -> None:
    from locos_tl import score_methods
    from locos_tl.engine.decode import greedy_decode

    # the gold answer is a word of the model's own response, so the trial is accepted
    t = org_trials[0]
    word = greedy_decode(organism, t.tokens, max_new_tokens=3).text.split()[0]
    trials = [Trial(tokens=t.tokens, needle_span=t.needle_span, answer=word)]
    kw = dict(max_new_tokens=3, progress=False)
    one = score_methods(organism, trials, methods="locos", **kw)  # was "unknown method 'l'"
    ref = score_methods(organism, trials, methods=["locos"], **kw)
    assert list(one) == ["locos"] and one["locos"].n_trials == 1
    assert torch.isfinite(one["locos"].trial_scores).all()
    torch.testing.assert_close(one["locos"].trial_scores, ref["locos"].trial_scores,
                               equal_nan=True)


def test_compare_rankings_ks() -> None:
    from locos_tl import compare_rankings

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    one = compare_rankings(a, b, ks=3)
    many = compare_rankings(a, b, ks=[3])
    pd.testing.assert_frame_equal(one, many)
    top = lambda s: set(np.argsort(-s.numpy().ravel(), kind="stable")[:3].tolist())  # noqa: E731
    assert one.loc[0, "top3_overlap"] == len(top(a) & top(b)) / 3
    for bad, msg in ((0, "ks = 0 is out of range"), ([-1], "ks = -1 is out of range")):
        with pytest.raises(HeadSpecError, match=msg):
            compare_rankings(a, b, ks=bad)


def test_plot_functions_parse_heads() -> None:
    g = torch.Generator().manual_seed(0)
    phi = torch.randn(2, 8, 5, generator=g).numpy()
    toks = list("abcde")
    fig = plot.phi_explorer(phi, toks, heads=["L1H2", "0-3", (1, 7)])
    hm = fig.data[0]
    np.testing.assert_array_equal(np.asarray(hm.z), phi[[1, 0, 1], [2, 3, 7]])
    assert list(fig.layout.yaxis.ticktext) == ["L1H2", "L0H3", "L1H7"]
    for bad, msg in (([(-1, 0)], "non-negative"),  # used to draw the last layer as "L-1H0"
                     ([(2, 0)], "outside the model's 2 layers x 8 heads"),
                     (["12"], "'12' is not a head"), ((1, 2), "got a single pair")):
        with pytest.raises(HeadSpecError, match=msg):
            plot.phi_explorer(phi, toks, heads=bad)
    att = np.abs(phi)
    ref = plot.reads_vs_writes(att, phi, toks, (1, 2))
    for form in ("L1H2", "1-2", [1, 2]):
        fig = plot.reads_vs_writes(att, phi, toks, form)
        np.testing.assert_array_equal(fig.data[1].y, phi[1, 2])
        assert fig.layout.title.text == ref.layout.title.text
    for bad, msg in (("12", "'12' is not a head"), ((-1, 0), "non-negative"),
                     ((0, 8), "outside"), ([(0, 0)], r"\[\(0, 0\)\] is not a head")):
        with pytest.raises(HeadSpecError, match=msg):
            plot.reads_vs_writes(att, phi, toks, bad)


# -- the CLI -------------------------------------------------------------------------
def _cli(args: list[str]):
    from typer.testing import CliRunner

    from locos_tl.cli import app

    return CliRunner().invoke(app, ["ablate", "--model", str(ORGANISM), *args])


@pytest.mark.parametrize("k, msg", [
    ("0", r"k = 0 is out of range: each k must be in 1..16"),
    ("99999", r"k = 99999 is more heads than the model has: each k must be in 1..16"),
    ("4,16,20", r"k = 20 is more heads than the model has"),
])
def test_cli_ablate_refuses_out_of_range_k(org_trials, tmp_path, k, msg) -> None:
    from locos_tl.trials import save_trials

    save_trials(org_trials, tmp_path / "t.jsonl")
    res = _cli(["--heads", "m=L1H2", "--trials", str(tmp_path / "t.jsonl"), "--k", k,
                "--mode", "query_zero", "--out", str(tmp_path / "run")])
    assert res.exit_code == 2, (res.output, str(res.exception))
    assert " ".join(res.output.split()).count("error:") == 1
    import re

    assert re.search(msg, " ".join(res.output.split())), res.output
    assert not (tmp_path / "run" / "meta.json").exists()


def test_cli_ablate_inline_head_list(org_trials, tmp_path) -> None:
    from locos_tl.trials import save_trials

    save_trials(org_trials[:1], tmp_path / "t.jsonl")
    base = ["--trials", str(tmp_path / "t.jsonl"), "--mode", "query_zero", "--no-random",
            "--bottom", "none", "--max-new-tokens", "1"]
    bad = _cli(["--heads", "m=12", *base, "--k", "1", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2
    assert "'12' is not a head" in " ".join(bad.output.split())
    res = _cli(["--heads", "m=L1H2,0-5", *base, "--k", "1,2", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(tmp_path / "run" / "evaluation.csv")
    assert set(zip(df["method"], df["k"], strict=True)) == {("baseline", 0), ("m", 1), ("m", 2)}
    sets = json.loads((tmp_path / "run" / "meta.json").read_text())["settings"]["head_sets"]
    assert sorted(sets.values()) == [[], [[1, 2]], [[1, 2], [0, 5]]]


# -- other malformed calls that used to end in raw Python errors or wrong figures ------
def test_plot_positions_and_dissociation_inputs() -> None:
    from locos_tl import dissociation_score

    phi = np.zeros((2, 8, 5))
    phi[1, 2, 3] = 1.0
    toks = list("abcde")
    fig = plot.phi_explorer(phi, toks, heads=["L1H2"], window=(2, 5), needle_span=(3, 4))
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), [[0.0, 1.0, 0.0]])
    for kw, msg in ((dict(window=(3, 1)), r"window \(3, 1\) must satisfy 0 <= start < end <= 5"),
                    (dict(window=(0, 99)), r"window \(0, 99\)"),
                    (dict(needle_span=(4, 2)), r"needle_span \(4, 2\)"),
                    (dict(needle_span=(0, 6)), r"needle_span \(0, 6\)")):
        with pytest.raises(ValueError, match=msg):
            plot.phi_explorer(phi, toks, **kw)
        with pytest.raises(ValueError, match=msg):
            plot.reads_vs_writes(np.abs(phi), phi, toks, "L1H2", **kw)
    with pytest.raises(ValueError, match=r"retrieval: not an ablation_sweep\(\) table"):
        dissociation_score(pd.DataFrame(), pd.DataFrame())  # was KeyError 'metric'
