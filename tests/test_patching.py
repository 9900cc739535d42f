"""CRI by activation patching, and ranking comparison, on a planted retrieval head."""

from __future__ import annotations

import math

import pytest
import torch
from planted import NAMES, PLANTED, build_planted, name_token, planted_trials
from tolerances import assert_close_within, model_tol

from locos_tl.errors import TrialError
from locos_tl.experiments.compare import compare_rankings, layer_buckets
from locos_tl.experiments.patching import corrupt_tokens, cri_trial, patch_heads
from locos_tl.experiments.score import score_methods
from locos_tl.models.load import load_model

METHODS = ["locos", "wu", "headkv", "attention_spatial", "dla"]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    model = load_model(build_planted(tmp_path_factory.mktemp("planted") / "m"), device="cpu")
    return model, planted_trials(model.tokenizer, 2)


def test_patch_heads_extend_grows_a_run(planted, tmp_path, monkeypatch) -> None:
    import sys

    from locos_tl.errors import LocosError

    model, trials = planted
    kw = dict(batch_size=3, max_new_tokens=3, progress=False)
    fresh = patch_heads(model, trials, **kw)
    run = tmp_path / "cri"
    patch_heads(model, trials[:1], out_dir=run, **kw)
    with pytest.raises(LocosError, match="another trial set"):  # growth is opt-in
        patch_heads(model, trials, out_dir=run, **kw)
    with pytest.raises(LocosError, match="cannot be extended"):
        patch_heads(model, trials[1:], out_dir=run, extend=True, **kw)
    done = []
    real = sys.modules["locos_tl.experiments.patching"].cri_trial
    monkeypatch.setattr(sys.modules["locos_tl.experiments.patching"], "cri_trial",
                        lambda m, t, **k: done.append(t.trial_id) or real(m, t, **k))
    grown = patch_heads(model, trials, out_dir=run, extend=True, **kw)
    assert done == [trials[1].trial_id]  # the finished trial is kept, not redone
    assert grown.n_trials == 2
    torch.testing.assert_close(grown.trial_scores, fresh.trial_scores, rtol=0, atol=0,
                               equal_nan=True)  # same code, same inputs: bit-equal


def test_corrupt_tokens(planted) -> None:
    model, trials = planted
    t = trials[0]
    s, e = t.needle_span
    tok = model.tokenizer
    filled = corrupt_tokens(tok, t, "filler")
    assert len(filled) == t.n_tokens
    assert filled[:s] == list(t.tokens[:s]) and filled[e:] == list(t.tokens[e:])
    assert name_token(tok, t.answer) not in filled[s:e]
    assert filled[s:e] == tok.encode("The grass is green.", add_special_tokens=False)[: e - s]
    swapped = corrupt_tokens(tok, t, "name_swap", swap_names=["Katie", "Gary"])
    diff = [i for i in range(t.n_tokens) if swapped[i] != t.tokens[i]]
    assert len(diff) == 1 and s <= diff[0] < e
    assert swapped[diff[0]] == name_token(tok, "Gary" if t.answer == "Katie" else "Katie")
    with pytest.raises(TrialError, match="same|token"):
        corrupt_tokens(tok, t, "name_swap", swap_names=["Zbigniewowski"])


def test_cri_ranks_planted_head_first_and_locos_agrees(planted) -> None:
    model, trials = planted
    cri = patch_heads(model, trials, batch_size=3, max_new_tokens=3, progress=False)
    assert cri.method == "cri" and cri.n_trials == 2
    assert cri.top_k(1) == [PLANTED]
    s = cri.scores.clone()
    planted_cri = float(s[PLANTED])
    s[PLANTED] = 0
    assert planted_cri > 5.0 and planted_cri > 20 * float(s.abs().max())
    scored = score_methods(model, trials, methods=METHODS, max_new_tokens=3, progress=False)
    for m in METHODS:  # all five from one decode pass; every one finds the copy head
        assert scored[m].n_trials == 2
        assert scored[m].top_k(1) == [PLANTED], m
    table = compare_rankings(cri, scored["locos"], ks=(1, 3)).set_index("bucket")
    assert table.loc["all", "top1_overlap"] == 1.0
    assert table.loc["all", "n_heads"] == 8


def _cri_tol(model, tokens) -> float:
    """A CRI score is a difference of two metrics, each a difference of two logits: four
    logits' float32 summation-order tolerance (tests/tolerances.py)."""
    with torch.no_grad():
        logits = model(torch.tensor([list(tokens)]), return_type="logits")[0]
    return 4 * model_tol(model, logits, n_tokens=len(tokens))


def test_batched_patching_equals_sequential(planted) -> None:
    model, trials = planted
    batched = cri_trial(model, trials[1], batch_size=3, max_new_tokens=3)
    seq = cri_trial(model, trials[1], batch_size=1, max_new_tokens=3, chunk_size=32)
    assert batched["n_forwards"] == 2 + math.ceil(8 / 3)
    assert seq["n_forwards"] == 2 + 8
    assert_close_within(torch.tensor(batched["scores"]["cri"]),
                        torch.tensor(seq["scores"]["cri"]), _cri_tol(model, trials[1].tokens),
                        "cri, batched vs sequential")
    assert batched["gold"] == name_token(model.tokenizer, trials[1].answer)
    assert batched["counterfactual"] != batched["gold"]
    assert batched["metric_clean"] > batched["metric_corrupted"] + 5


def test_cri_matches_naive_full_forward_patching(planted) -> None:
    """Oracle: plain full-sequence forwards with ``run_with_hooks``, no cache, no batch."""
    model, trials = planted
    t = trials[0]
    rec = cri_trial(model, t, batch_size=5, answer_position="prompt_end", chunk_size=16)
    assert rec["shared_prefix"] == t.needle_span[0]
    clean = torch.tensor([t.tokens])
    corr = torch.tensor([corrupt_tokens(model.tokenizer, t, "filler")])
    gold, cf = rec["gold"], rec["counterfactual"]
    tol = _cri_tol(model, t.tokens)
    with torch.no_grad():
        _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_z"))
        base = model(corr)[0, -1]
        assert int(base.clone().index_fill_(0, torch.tensor([gold]), -1e9).argmax()) == cf
        for l, h in [PLANTED, (0, 1), (1, 3)]:
            z = cache[f"blocks.{l}.attn.hook_z"]

            def patch(x, hook, h=h, z=z):
                x = x.clone()
                x[:, :, h] = z[:, :, h]
                return x

            out = model.run_with_hooks(corr, fwd_hooks=[(f"blocks.{l}.attn.hook_z", patch)])
            want = float((out[0, -1, gold] - out[0, -1, cf]) - (base[gold] - base[cf]))
            assert_close_within(rec["scores"]["cri"][l][h], want, tol, f"cri L{l}H{h}")


def test_identity_corruption_gives_zero_cri(planted) -> None:
    model, trials = planted
    t = trials[0]
    s, e = t.needle_span
    rec = cri_trial(model, t, filler=list(t.tokens[s:e]), answer_position="prompt_end")
    tol = _cri_tol(model, t.tokens)
    cri = torch.tensor(rec["scores"]["cri"])
    assert_close_within(cri, torch.zeros_like(cri), tol, "cri of an identity corruption")
    assert_close_within(rec["metric_clean"], rec["metric_corrupted"], tol / 2, "metrics")


def test_name_swap_cri(planted) -> None:
    model, trials = planted
    cri = patch_heads(model, trials[:1], corruption="name_swap", swap_names=list(NAMES),
                      answer_position="prompt_end", progress=False)
    assert cri.top_k(1) == [PLANTED]


def test_patch_heads_refuses_bad_trials_before_any_forward(planted, forward_count) -> None:
    """``name_swap`` on a last trial whose needle lacks the answer is refused before any
    forward pass (it failed after the other trials' patching), naming the trial."""
    from locos_tl import Trial

    model, trials = planted
    t = trials[0]
    bad = Trial(tokens=t.tokens, needle_span=t.needle_span, answer="Stuart",
                tokenizer_fingerprint=t.tokenizer_fingerprint)
    kw = dict(corruption="name_swap", swap_names=list(NAMES), answer_position="prompt_end",
              progress=False)
    with pytest.raises(TrialError, match=rf"^patch_heads: trial 2 \({bad.trial_id}\): answer "
                       r"'Stuart' does not occur in the needle tokens \(corruption='name_swap'\)$"):
        patch_heads(model, [*trials, bad], **kw)
    assert forward_count.n == 0


def test_cri_under_no_grad_and_inference_mode(planted, grad_off) -> None:
    """CRI needs no gradient: under each grad-off context it runs the same code on the
    same inputs (greedy decode included), so its scores are the plain call's bit for bit."""
    model, trials = planted
    kw = dict(batch_size=3, max_new_tokens=3, progress=False)
    plain = patch_heads(model, trials, **kw)
    assert plain.meta["n_accepted"] == 2
    with grad_off.context():
        got = patch_heads(model, trials, **kw)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    torch.testing.assert_close(got.trial_scores, plain.trial_scores, rtol=0, atol=0)


def test_compare_rankings_known_values() -> None:
    a = torch.arange(12, dtype=torch.float64).reshape(6, 2)
    same = compare_rankings(a, a * 3 + 1, ks=(2, 4)).set_index("bucket")
    assert same.loc["all", "spearman"] == pytest.approx(1.0)
    assert same.loc["all", "kendall"] == pytest.approx(1.0)
    assert same.loc["all", "top4_overlap"] == 1.0
    rev = compare_rankings(a, -a, ks=(2,)).set_index("bucket")
    assert rev.loc["all", "spearman"] == pytest.approx(-1.0)
    assert rev.loc["all", "top2_overlap"] == 0.0
    assert list(rev["layers"]) == ["0-5", "0-1", "2-3", "4-5"]
    assert rev.loc["early", "n_heads"] == 4
    b = a.clone()
    b[5, 1], b[0, 0] = 0.0, 11.0  # swap best and worst
    t = compare_rankings(a, b, ks=(1, 2)).set_index("bucket")
    assert t.loc["all", "top1_overlap"] == 0.0 and t.loc["all", "top2_overlap"] == 0.5
    assert t.loc["middle", "spearman"] == pytest.approx(1.0)  # untouched layers
    assert t.loc["early", "top2_overlap"] == 0.5  # early holds (0, 0): its top-2 loses one
    nan = a.clone()
    nan[0, 0] = float("nan")
    assert compare_rankings(nan, a, ks=()).set_index("bucket").loc["all", "n_heads"] == 11
    assert layer_buckets(2) == {"early": [0], "middle": [1], "late": []}


def test_cli_patch(planted, tmp_path) -> None:
    from typer.testing import CliRunner

    from locos_tl.cli import app
    from locos_tl.trials import save_trials

    model, trials = planted
    save_trials(trials[:1], tmp_path / "trials.jsonl")
    ckpt = model.original_model.config._name_or_path
    res = CliRunner().invoke(app, [
        "patch", "--model", ckpt, "--trials", str(tmp_path / "trials.jsonl"),
        "--max-new-tokens", "3", "--batch-size", "8", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    out = tmp_path / "run"
    for f in ("scores.csv", "head_scores.json", "comparison.csv", "meta.json",
              "cri_vs_locos.html", "locos/scores.csv"):
        assert (out / f).exists(), f
    lines = res.output.splitlines()
    header = next(i for i, x in enumerate(lines) if x.split()[:2] == ["label", "score"])
    assert lines[header + 1].split()[0] == "L1H2"  # the top row of the CRI table
