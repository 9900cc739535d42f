"""No silent wrong results: a run directory is one run with
one layout, non-finite numbers drop a trial with a warning, a score set without accepted
trials refuses to rank, and context/span checks hold everywhere."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from locos_tl import Trial, save_trials
from locos_tl.cli import app
from locos_tl.detectors import get_detector
from locos_tl.engine.ablation import calibrate_means
from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.options import DecodeOptions
from locos_tl.engine.phi import phi_from_model
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.errors import LocosError, NonFiniteError, TrialError
from locos_tl.experiments.patching import patch_heads
from locos_tl.experiments.score import run_trial, score_methods, score_trials
from locos_tl.heads import HeadScores
from locos_tl.runs.rundir import load_head_scores
from locos_tl.trials import trial_set_hash

runner = CliRunner()


def _score(model, trials, **kw):
    """score_methods when ``methods=`` is given (a dict back), else score_trials."""
    kw.setdefault("max_new_tokens", 8)
    fn = score_methods if "methods" in kw else score_trials
    return fn(model, trials, progress=False, **kw)


# -- 1. a run directory is one run ----------------------------------------------------


def test_other_trial_set_refused_api(qwen3, own_answer_trials, tmp_path):
    a, b = own_answer_trials[:2], own_answer_trials[1:]
    _score(qwen3, a, out_dir=tmp_path)
    lines = (tmp_path / "trials.jsonl").read_text()
    with pytest.raises(LocosError) as info:
        _score(qwen3, b, out_dir=tmp_path)
    msg = str(info.value)
    assert trial_set_hash(a) in msg and trial_set_hash(b) in msg
    assert "new --out" in msg and f"delete {tmp_path}" in msg
    assert (tmp_path / "trials.jsonl").read_text() == lines  # nothing mixed in
    # the same set resumes; a reordered set is another run
    _score(qwen3, a, out_dir=tmp_path)
    with pytest.raises(LocosError, match="another trial set"):
        _score(qwen3, a[::-1], out_dir=tmp_path)


def test_other_trial_set_refused_cli(tiny_dirs, own_answer_trials, tmp_path):
    ta = save_trials(own_answer_trials[:1], tmp_path / "a.jsonl")
    tb = save_trials(own_answer_trials[1:2], tmp_path / "b.jsonl")
    out = tmp_path / "run"
    args = ["score", "--model", str(tiny_dirs["qwen3"]), "--out", str(out),
            "--max-new-tokens", "8", "--trials"]
    assert runner.invoke(app, [*args, str(ta)]).exit_code == 0
    res = runner.invoke(app, [*args, str(tb)])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())  # typer may wrap the message
    assert trial_set_hash(own_answer_trials[:1]) in text
    assert trial_set_hash(own_answer_trials[1:2]) in text
    assert len((out / "trials.jsonl").read_text().splitlines()) == 1


def test_method_layout_and_stale_folders_cli(qwen3, tiny_dirs, own_answer_trials, tmp_path):
    trials = save_trials(own_answer_trials[:2], tmp_path / "t.jsonl")
    out = tmp_path / "run"
    args = ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials),
            "--out", str(out), "--max-new-tokens", "8", "--method"]
    res = runner.invoke(app, [*args, "locos,wu"])
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"locos", "wu"}
    # fewer methods: nothing is deleted; the run's other method is kept, and said so
    before = pd.read_csv(out / "scores.csv")
    res = runner.invoke(app, [*args, "locos"])
    assert res.exit_code == 0, res.output
    assert "also holds wu scores" in res.output and "kept" in res.output
    assert {p.name for p in out.iterdir() if p.is_dir()} == {"locos", "wu"}
    assert not (out / "heads.json").exists() and (out / "locos" / "heads.json").exists()
    pd.testing.assert_frame_equal(pd.read_csv(out / "scores.csv"), before)
    assert json.loads((out / "meta.json").read_text())["settings"]["methods"] == ["locos", "wu"]
    # back to two: both folders again, and every consumer reads the run
    assert runner.invoke(app, [*args, "wu,locos"]).exit_code == 0
    assert set(pd.read_csv(out / "scores.csv")["method"]) == {"locos", "wu"}
    direct = _score(qwen3, own_answer_trials[:2], methods=["locos", "wu"])
    assert load_head_scores(out).method == "locos"  # several methods: locos by default
    for m in ("locos", "wu"):
        for hs in (load_head_scores(out, m), load_head_scores(out / m)):
            assert hs.method == m
            assert torch.allclose(hs.scores, direct[m].scores, atol=1e-12)
    with pytest.raises(LocosError, match="not of 'dla'"):
        load_head_scores(out, "dla")


def test_loader_reads_api_run_dirs(qwen3, own_answer_trials, tmp_path):
    """score_trials(out_dir=D) writes only records and meta.json: the loader aggregates
    them, for D and for D/<method>; several methods without locos need a choice."""
    res = _score(qwen3, own_answer_trials, methods=["wu", "headkv"], out_dir=tmp_path)
    for m in ("wu", "headkv"):
        hs = load_head_scores(tmp_path / m)
        assert hs.method == m and hs.n_trials == res[m].n_trials >= 1
        assert hs.meta["n_accepted"] == res[m].meta["n_accepted"]
        assert torch.allclose(hs.scores, res[m].scores, atol=1e-12)
        assert hs.ranked() == res[m].ranked()
        # one path from records to HeadScores (runner.aggregate): the same meta counts
        for key in ("span", "acceptance", "n_trials", "n_dropped_gate", "settings"):
            assert hs.meta[key] == res[m].meta[key], key
    with pytest.raises(LocosError, match="several methods") as info:
        load_head_scores(tmp_path)
    assert str(tmp_path / "wu") in str(info.value)
    # an interrupted run is not read as if it were complete
    lines = (tmp_path / "trials.jsonl").read_text().splitlines()
    (tmp_path / "trials.jsonl").write_text(lines[0] + "\n")
    with pytest.raises(LocosError, match="unfinished run .1 of 3"):
        load_head_scores(tmp_path, "wu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no head scores"):
        load_head_scores(tmp_path / "empty")


def test_api_rescore_with_fewer_methods_keeps_the_others(qwen3, own_answer_trials, tmp_path):
    """From Python as from `locos score`: a rescoring with fewer methods deletes nothing;
    the others are scored again from the same records, and a warning says so."""
    from locos_tl.cli.score import write_outputs

    res = _score(qwen3, own_answer_trials[:1], methods=["locos", "wu"], out_dir=tmp_path)
    write_outputs(res, tmp_path)
    (tmp_path / "wu" / "notes.txt").write_text("mine")  # a user's file
    with pytest.warns(UserWarning, match="also holds wu scores .* kept"):
        again = _score(qwen3, own_answer_trials[:1], methods=["locos"], out_dir=tmp_path)
    assert list(again) == ["locos"]
    assert torch.equal(again["locos"].scores, res["locos"].scores)
    assert load_head_scores(tmp_path, "wu").n_trials == res["wu"].n_trials
    assert (tmp_path / "locos" / "head_scores.json").exists()
    assert (tmp_path / "wu" / "notes.txt").exists()
    with pytest.warns(UserWarning, match="also holds wu scores"):
        one = _score(qwen3, own_answer_trials[:1], method="locos", out_dir=tmp_path)
    assert one.method == "locos"  # one method asked: one HeadScores back
    (tmp_path / "wu" / "notes.txt").unlink()
    with pytest.warns(UserWarning, match=r"removed the folders of wu, methods this run does "
                                         r"not score \(locos\)"):  # never silently
        write_outputs(res["locos"], tmp_path)
    assert not (tmp_path / "wu").exists()
    # the run still scores wu (meta.json, records): its scores come back from them
    assert load_head_scores(tmp_path, "wu").n_trials == res["wu"].n_trials


def test_ablate_reads_multi_method_run(tiny_dirs, own_answer_trials, tmp_path):
    """`locos ablate --heads runs/x` (the README's command) after a multi-method score."""
    trials = save_trials(own_answer_trials[:1], tmp_path / "t.jsonl")
    run = tmp_path / "x"
    res = runner.invoke(app, ["score", "--model", str(tiny_dirs["qwen3"]), "--trials",
                              str(trials), "--out", str(run), "--max-new-tokens", "8",
                              "--method", "locos,wu"])
    assert res.exit_code == 0, res.output
    abl = tmp_path / "abl"

    def ablate(*heads: str):
        args = ["ablate", "--model", str(tiny_dirs["qwen3"])]
        for h in heads:
            args += ["--heads", h]
        return runner.invoke(app, [*args, "--trials", str(trials), "--out", str(abl), "--k",
                                   "1", "--mode", "query_zero", "--no-random", "--bottom",
                                   "none", "--max-new-tokens", "4"])

    # the method folder is read too; on this random model every Wu score is 0, which
    # is refused as a ranking (it ranks nothing) before anything is written
    res = ablate(str(run), str(run / "wu"))
    assert res.exit_code == 2 and "every wu score is 0" in res.output
    assert not abl.exists()
    res = ablate(str(run))
    assert res.exit_code == 0, res.output
    df = pd.read_csv(abl / "evaluation.csv")
    assert "locos" in set(df["method"])


# -- 4. non-finite numbers ------------------------------------------------------------


class _nan_when_fed:
    """Context: the embedding row of ``token`` set to NaN (as an fp16 overflow leaves
    it), so any prompt or step feeding ``token`` gets NaN logits. The row is the weight
    tensor every decode path shares (bridge and SDPA twin); restored on exit."""

    def __init__(self, model, token: int):
        emb = next(m for m in model.original_model.modules()
                   if isinstance(m, torch.nn.Embedding))
        self.weight, self.token = emb.weight, token

    def __enter__(self):
        self.saved = self.weight.data[self.token].clone()
        self.weight.data[self.token] = float("nan")

    def __exit__(self, *exc):
        self.weight.data[self.token] = self.saved


def test_nan_logits_raise_in_decoding(qwen3, own_answer_trials):
    tokens = list(own_answer_trials[0].tokens)
    with _nan_when_fed(qwen3, tokens[-1]), pytest.raises(
            NonFiniteError, match="step 0: the logits hold NaN"):
        greedy_decode(qwen3, tokens, max_new_tokens=4)
    assert greedy_decode(qwen3, tokens, max_new_tokens=4).generated  # restored


def test_nan_trial_dropped_and_not_counted(qwen3, own_answer_trials):
    good = list(own_answer_trials)
    clean = _score(qwen3, good, methods=["locos", "wu"])
    fed = {t for r in clean["locos"].records for t in r["generated"]}
    fed |= {tok for t in good for tok in t.tokens}  # magic: a token no good trial feeds
    magic = next(i for i in range(5, int(qwen3.cfg.d_vocab)) if i not in fed)
    bad = Trial(tokens=[*good[0].tokens[:-1], magic], needle_span=(5, 9),
                answer=good[0].answer)
    with _nan_when_fed(qwen3, magic), pytest.warns(
            RuntimeWarning, match=f"trial {bad.trial_id} dropped .non_finite"):
        res = _score(qwen3, [*good, bad], methods=["locos", "wu"])
    for m in ("locos", "wu"):
        hs = res[m]
        assert hs.n_trials == 3 and hs.meta["n_dropped_non_finite"] == 1
        assert hs.meta["n_trials"] == 4 and hs.meta["n_accepted"] == 3
        assert torch.allclose(hs.scores, clean[m].scores, atol=1e-12)
        assert set(hs.to_frame()["n_trials"]) == {3}
    rec = next(r for r in res["locos"].records if r["trial_id"] == bad.trial_id)
    assert rec["dropped"] == "non_finite" and not rec["accepted"] and "NaN" in rec["non_finite"]


class _NanDirections(AnswerDirections):
    """Finite logits, NaN answer direction: phi alone turns NaN."""

    def __call__(self, token, scales=None):
        return super().__call__(token, scales) * float("nan")


def test_nan_phi_drops_trial(qwen3, own_answer_trials):
    trial = own_answer_trials[0]
    dets = [get_detector("locos"), get_detector("wu")]
    ok = run_trial(qwen3, trial, dets, directions=AnswerDirections(qwen3, "raw"),
                   decode=DecodeOptions(max_new_tokens=8))
    assert ok["accepted"]
    with pytest.warns(RuntimeWarning, match="phi holds NaN"):
        rec = run_trial(qwen3, trial, dets, directions=_NanDirections(qwen3, "raw"),
                        decode=DecodeOptions(max_new_tokens=8))
    assert rec["dropped"] == "non_finite" and rec["scores"] == {}


def test_phi_from_model_raises_on_non_finite(qwen3, own_answer_trials, monkeypatch):
    import locos_tl.engine.phi as phi_mod

    tokens = own_answer_trials[0].tokens
    assert torch.isfinite(phi_from_model(qwen3, tokens, 7)).all()
    monkeypatch.setattr(phi_mod, "AnswerDirections", _NanDirections)
    with pytest.raises(NonFiniteError, match="phi holds .* NaN or inf"):
        phi_from_model(qwen3, tokens, 7)


def test_nan_per_trial_scores_not_counted():
    """A NaN per-trial value is skipped by the mean and not counted in n_trials."""
    def rec(i, s):
        return {"trial_id": f"t{i}", "accepted": True, "scores": {"m": s}}

    nan = float("nan")
    records = [rec(0, [[1.0, 2.0]]), rec(1, [[nan, 4.0]]), rec(2, [[nan, nan]])]
    hs = HeadScores.from_records(records, "m", n_layers=1, n_heads=2)
    assert hs.n_trials == 2 and hs.trial_ids == ["t0", "t1"]
    df = hs.to_frame().set_index("label")
    assert df.loc["L0H0", "n_trials"] == 1 and df.loc["L0H0", "score"] == 1.0
    assert df.loc["L0H1", "n_trials"] == 2 and df.loc["L0H1", "score"] == 3.0


# -- 5. nothing accepted ---------------------------------------------------------------


def test_no_accepted_trial_warns_and_refuses_rankings(qwen3, own_answer_trials, tmp_path):
    with pytest.warns(RuntimeWarning, match=r"0 of 3 \(3 failed the gate"):
        hs = _score(qwen3, own_answer_trials, gate_threshold=1.0)
    assert hs.n_trials == 0 and torch.isnan(hs.scores).all()
    for rank in (lambda: hs.top_k(3), lambda: hs.bottom_k(3), hs.ranked):
        with pytest.raises(LocosError, match="cannot rank the 'locos' heads.*gate: 3"):
            rank()
    with pytest.warns(RuntimeWarning, match="heads.json holds an empty list"):
        hs.save(tmp_path)
    assert all(v == [] for v in json.loads((tmp_path / "heads.json").read_text()).values())
    back = HeadScores.load(tmp_path)
    with pytest.raises(LocosError, match="cannot rank"):
        back.top_k(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an accepted run says nothing
        assert len(_score(qwen3, own_answer_trials[:1]).top_k(3)) == 3


def test_patch_heads_no_usable_trial(qwen3, own_answer_trials):
    t = own_answer_trials[0]
    never = Trial(tokens=t.tokens, needle_span=t.needle_span, answer="Zyxwvq Qqqq")
    with pytest.warns(RuntimeWarning, match="no usable trial: 0 of 1"):
        cri = patch_heads(qwen3, [never], max_new_tokens=4, progress=False)
    assert cri.n_trials == 0 and cri.meta["n_dropped_no_answer_step"] == 1
    with pytest.raises(LocosError, match="cannot rank the 'cri' heads"):
        cri.top_k(1)


# -- 6. context and span checks ---------------------------------------------------------


def test_calibrate_means_refuses_longer_than_context(qwen3):
    n_ctx = int(qwen3.cfg.n_ctx)
    long = [1 + i % 50 for i in range(n_ctx + 1)]
    with pytest.raises(TrialError, match=f"{n_ctx + 1} tokens .*n_ctx={n_ctx}"):
        calibrate_means(qwen3, [long[:10], long], max_tokens=10 * n_ctx)
    cut = calibrate_means(qwen3, [long], max_tokens=n_ctx)  # cut to fit: runs
    assert cut.n_tokens == n_ctx and torch.isfinite(cut.q).all()


def test_patch_prompt_end_checks_only_the_prompt(qwen3):
    n_ctx = int(qwen3.cfg.n_ctx)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, int(qwen3.cfg.d_vocab) - 1, (n_ctx,), generator=g).tolist()
    full = Trial(tokens=tokens, needle_span=(n_ctx - 8, n_ctx - 4), answer="x")
    with pytest.raises(TrialError, match="longer than the model's context"):
        patch_heads(qwen3, [full], answer_position="generated", max_new_tokens=8,
                    progress=False)
    cri = patch_heads(qwen3, [full], answer_position="prompt_end", max_new_tokens=50,
                      batch_size=8, progress=False)
    assert cri.n_trials == 1 and torch.isfinite(cri.scores).all()
    over = Trial(tokens=[*tokens, 5], needle_span=(3, 5), answer="x")
    with pytest.raises(TrialError, match="longer than the model's context"):
        patch_heads(qwen3, [over], answer_position="prompt_end", progress=False)


@pytest.mark.parametrize(("span", "match"), [
    ((0, 6), "covers the whole prompt of 6 tokens"),
    ((3, 3), r"not inside .*\(it is empty\)"),
    ((4, 2), r"\(it is empty\)"),
    ((2, 7), "not inside the prompt of 6"),
    ((-1, 2), "not inside"),
])
def test_trial_refuses_bad_spans(span, match):
    with pytest.raises(TrialError, match=match):
        Trial(tokens=[1, 2, 3, 4, 5, 6], needle_span=span, answer="x")


def test_trial_span_with_one_off_needle_position_scores(qwen3, own_answer_trials):
    """(1, N) leaves one off-needle key at step 1: accepted, and the contrast is finite."""
    t = own_answer_trials[0]
    edge = Trial(tokens=t.tokens, needle_span=(1, t.n_tokens), answer=t.answer)
    hs = _score(qwen3, [edge])
    assert hs.n_trials == 1 and torch.isfinite(hs.scores).all()
