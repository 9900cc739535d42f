"""score_trials end to end on a tiny Qwen3: values, one-pass methods, resume, errors."""

import json

import pytest
import torch
from tolerances import assert_close_within, model_tol

import locos_tl.experiments.score as score_mod
from locos_tl import LocosError, Trial, TrialError, phi_from_model, score_methods, score_trials
from locos_tl.engine.decode import greedy_decode


@pytest.fixture(scope="module")
def trials(own_answer_trials):
    out = own_answer_trials
    gated = Trial(tokens=out[0].tokens, needle_span=(5, 9), answer="zzzqqq")  # fails the gate
    return [*out, gated]


def test_locos_equals_independent_recomputation(qwen3, trials):
    hs = score_trials(qwen3, trials, max_new_tokens=8, progress=False)
    assert hs.n_trials == 3 and hs.meta["n_dropped_gate"] == 1
    frame = hs.records_frame()
    assert frame["accepted"].tolist() == [True, True, True, False]
    assert frame["dropped"].tolist()[-1] == "gate" and "seed" in frame.columns
    s, e = 5, 9
    per_trial, scale, n_max = [], 0.0, 0
    for t in trials[:3]:
        res = greedy_decode(qwen3, t.tokens, max_new_tokens=8)
        from locos_tl.engine.answers import answer_steps

        steps = answer_steps(qwen3.tokenizer, res.generated, t.answer)
        contrasts = []
        for st in steps:
            ctx = list(t.tokens) + res.generated[:st]
            phi = phi_from_model(qwen3, ctx, res.generated[st])
            scale, n_max = max(scale, float(phi.abs().sum(-1).max())), max(n_max, len(ctx))
            n, N = e - s, len(ctx)
            plus = phi[..., s:e].sum(-1)
            minus = (phi.sum(-1) - plus) * n / (N - n)
            contrasts.append(plus - minus)
        per_trial.append(torch.stack(contrasts).mean(0))
    expected = torch.stack(per_trial).mean(0).double()
    # contrasts sum phi over positions (partial sums below sum_j |phi_j|), then means
    tol = model_tol(qwen3, scale, n_tokens=n_max, reads=5)
    assert_close_within(hs.scores, expected, tol, "locos scores vs recomputation")
    assert hs.scores.abs().max().item() > 10 * tol


def test_one_pass_many_methods_equals_separate_runs(qwen3, trials):
    five = ["locos", "wu", "headkv", "attention_spatial", "dla"]
    many = score_methods(qwen3, trials, methods=five,
                         max_new_tokens=8, progress=False)
    assert set(many) == {"locos", "wu", "headkv", "attention_spatial", "dla"}
    for m in ("locos", "wu", "dla"):
        alone = score_trials(qwen3, trials, method=m, max_new_tokens=8, progress=False)
        torch.testing.assert_close(many[m].scores, alone.scores)
    # DLA = sum of phi over positions; attention-spatial lives in [-1, 1]
    assert many["attention_spatial"].scores.abs().max().item() <= 1.0
    assert (many["wu"].scores >= 0).all() and (many["headkv"].scores >= 0).all()


def test_resume_skips_finished_and_survives_a_crash(qwen3, trials, tmp_path, monkeypatch):
    clean = score_trials(qwen3, trials, max_new_tokens=8, progress=False)
    out = tmp_path / "run"
    real = score_mod.run_trial
    calls = {"n": 0}

    def crashing(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(score_mod, "run_trial", crashing)
    with pytest.raises(RuntimeError, match="simulated crash"):
        score_trials(qwen3, trials, max_new_tokens=8, out_dir=out, progress=False)
    lines = (out / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 2  # the two finished trials survived
    meta = json.loads((out / "meta.json").read_text())
    assert meta["settings"]["variant"] == "raw"
    assert meta["versions"]["transformer-lens"].startswith("4.3")
    assert meta["model"]["weight_processing"] == "raw_hf" and meta["settings"]["trial_set_hash"]

    calls["n"] = -100  # no more crashes; count reruns
    resumed = score_trials(qwen3, trials, max_new_tokens=8, out_dir=out, progress=False)
    assert calls["n"] == -100 + 2  # only the 2 unfinished trials ran
    torch.testing.assert_close(resumed.scores, clean.scores)
    assert len((out / "trials.jsonl").read_text().splitlines()) == 4

    with pytest.raises(LocosError, match="other settings"):
        score_trials(qwen3, trials, max_new_tokens=8, out_dir=out, variant="exact", progress=False)


def test_a_run_records_its_options_and_reads_them_back(qwen3, trials, tmp_path):
    """``meta.json``'s settings are the run's :class:`ScoreOptions` (the keys runs have
    always recorded, with the same values), and read back into the same options; an
    options object and the keywords it stands for score alike."""
    from locos_tl import DecodeOptions, ScoreOptions

    options = ScoreOptions(methods=("locos", "wu"), seed=3,
                           decode=DecodeOptions(max_new_tokens=8, stop_rule="contains_newline"))
    got = score_methods(qwen3, trials[:2], options, out_dir=tmp_path, progress=False)
    settings = json.loads((tmp_path / "meta.json").read_text())["settings"]
    assert {k: settings[k] for k in ("variant", "methods", "max_new_tokens", "gate_threshold",
                                     "stop_rule", "thinking", "spans", "seed")} == {
        "variant": "raw", "methods": ["locos", "wu"], "max_new_tokens": 8,
        "gate_threshold": 0.5, "stop_rule": "contains_newline", "thinking": True,
        "spans": {"locos": "needle", "wu": "answer"}, "seed": 3}
    back = ScoreOptions.from_settings(settings)
    assert back.decode == options.decode and back.methods == options.methods
    assert (back.seed, back.variant, back.batch_size) == (3, "raw", 1)
    kw = score_methods(qwen3, trials[:2], methods=["locos", "wu"], seed=3, max_new_tokens=8,
                       stop_rule="contains_newline", progress=False)
    for m in ("locos", "wu"):
        torch.testing.assert_close(kw[m].scores, got[m].scores, rtol=0, atol=0)


def test_on_resume_reports_what_the_run_reuses(qwen3, trials, tmp_path, monkeypatch):
    """The count a resumed run reports (``locos score`` prints "skipping N of M" from it)
    comes from the reuse rule itself: a record made with another span reruns and is not
    counted (a count kept apart from the rule said 4 here)."""
    out = tmp_path / "run"
    seen: list[tuple[int, int]] = []
    first = score_trials(qwen3, trials, max_new_tokens=8, out_dir=out, progress=False,
                         on_resume=lambda *a: seen.append(a))
    real, ran = score_mod.run_trial, []

    def counting(model, trial, *a, **k):
        ran.append(trial.trial_id)
        return real(model, trial, *a, **k)

    monkeypatch.setattr(score_mod, "run_trial", counting)
    again = score_trials(qwen3, trials, max_new_tokens=8, out_dir=out, progress=False,
                         on_resume=lambda *a: seen.append(a))
    assert ran == [] and seen == [(0, 4), (4, 4)]
    torch.testing.assert_close(again.scores, first.scores)
    score_trials(qwen3, trials, max_new_tokens=8, out_dir=out, progress=False,
                 spans={"locos": "answer"}, on_resume=lambda *a: seen.append(a))
    assert seen[-1] == (0, 4) and ran == [t.trial_id for t in trials]
    score_trials(qwen3, trials[:1], max_new_tokens=8, progress=False,  # no run directory
                 on_resume=lambda *a: seen.append(a))
    assert len(seen) == 3


def test_bad_inputs_fail_before_any_work(qwen3, trials, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("decoding started")

    monkeypatch.setattr(score_mod, "run_trial", boom)
    long = Trial(tokens=[1] * (qwen3.cfg.n_ctx - 2), needle_span=(0, 3), answer="x")
    with pytest.raises(TrialError, match="longer than the model's context"):
        score_trials(qwen3, [trials[0], long], max_new_tokens=8, progress=False)
    oov = Trial(tokens=[1, 2, 10**6], needle_span=(0, 1), answer="x")
    with pytest.raises(TrialError, match="outside the model's vocabulary"):
        score_trials(qwen3, [oov], progress=False)
    with pytest.raises(ValueError, match="unknown method"):
        score_trials(qwen3, trials, method="nope")
    with pytest.raises(ValueError, match="unknown variant"):
        score_trials(qwen3, trials, variant="approx")
    with pytest.raises(ValueError, match="no trials to score"):
        score_trials(qwen3, [])
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
        score_trials(qwen3, trials, max_new_tokens=0)


def test_every_method_checks_every_trial_before_the_decode_pass(qwen3, trials,
                                                                forward_count):
    """LOCOS beside QRHead: a last trial without a question is refused before the shared
    decode pass (it was refused after the decode pass of every trial, and with no
    ``out_dir`` that work was lost); bad trials are all named in one error."""
    asked = [Trial(tokens=t.tokens, needle_span=t.needle_span, answer=t.answer,
                   meta={"question_span": [20, 24]}) for t in trials[:3]]
    bare = trials[3]
    with pytest.raises(TrialError, match=rf"^score_methods: trial 3 \({bare.trial_id}\): no "
                                         "question for QRHead"):
        score_methods(qwen3, [*asked, bare], methods=["locos", "qrhead"], max_new_tokens=4,
                      progress=False)
    n_ctx = int(qwen3.cfg.n_ctx)
    long = Trial(tokens=[1] * (n_ctx - 2), needle_span=(0, 3), answer="x")
    oov = Trial(tokens=[1, 2, 10**6], needle_span=(0, 1), answer="x")
    with pytest.raises(TrialError) as err:
        score_trials(qwen3, [trials[0], long, oov], max_new_tokens=8, progress=False)
    assert str(err.value).splitlines() == [
        "score_trials: 2 of 3 trials cannot run:",
        f"  trial 1 ({long.trial_id}): prompt of {n_ctx - 2} tokens + 8 new tokens is longer "
        f"than the model's context n_ctx={n_ctx}",
        f"  trial 2 ({oov.trial_id}): token id 1000000 outside the model's vocabulary of "
        f"{qwen3.cfg.d_vocab} (trials built with another tokenizer?)",
    ]
    assert forward_count.n == 0


def test_resume_refuses_another_dtype(qwen3, tiny_dirs, own_answer_trials, tmp_path):
    from locos_tl import load_model

    score_trials(qwen3, own_answer_trials[:1], max_new_tokens=8, out_dir=tmp_path, progress=False)
    bf16 = load_model(tiny_dirs["qwen3"], device="cpu", dtype="bfloat16")
    with pytest.raises(LocosError, match="dtype: 'float32' != 'bfloat16'"):
        score_trials(bf16, own_answer_trials[:1], max_new_tokens=8, out_dir=tmp_path,
                     progress=False)


def test_every_registered_method_is_reached_by_score_trials(qwen3, own_answer_trials):
    """``score_trials(method=name)`` scores every method of the registry: an own-pass
    method gives its function's scores bit for bit (the same code on the same inputs:
    ``atp_heads``, ``qrhead_heads``, ``patch_heads``), a decode-pass method the scores
    of the one decode pass that all of them share (within float32 summation order: 30
    prompt and 8 new tokens, phi read off the residual stream and summed over positions,
    as in :func:`test_locos_equals_independent_recomputation`)."""
    from locos_tl.experiments.atp import atp_heads
    from locos_tl.experiments.methods import METHODS
    from locos_tl.experiments.patching import patch_heads
    from locos_tl.experiments.qrhead import qrhead_heads

    asked = [Trial(tokens=t.tokens, needle_span=t.needle_span, answer=t.answer,
                   meta={"question_span": [20, 24]}) for t in own_answer_trials]
    kw = dict(max_new_tokens=8, progress=False)
    direct = {"atp": atp_heads(qwen3, asked, **kw), "cri": patch_heads(qwen3, asked, **kw),
              "qrhead": qrhead_heads(qwen3, asked, progress=False)}
    shared = score_methods(qwen3, asked, methods=[m for m in METHODS
                                                  if METHODS[m].decode_pass], **kw)
    assert set(direct) | set(shared) == set(METHODS)
    assert direct["cri"].n_trials == direct["atp"].n_trials == 3  # every trial answered
    for name in METHODS:
        hs = score_trials(qwen3, asked, method=name, **kw)
        assert hs.method == name
        if name in direct:
            torch.testing.assert_close(hs.trial_scores, direct[name].trial_scores, rtol=0,
                                       atol=0)
        else:  # the same decode; LOCOS and DLA sum phi in another order beside others
            tol = model_tol(qwen3, shared[name].scores, n_tokens=38, reads=5)
            assert_close_within(hs.scores, shared[name].scores, tol, name)
    with pytest.raises(ValueError, match=r"^cri reads no span \(got spans=\{'cri': 'needle'"):
        score_trials(qwen3, asked, method="cri", spans={"cri": "needle"}, **kw)


def test_an_unknown_method_is_refused_with_the_registered_names(qwen3, trials):
    from locos_tl.experiments.methods import METHODS

    for call in (lambda: score_trials(qwen3, trials, method="nope"),
                 lambda: score_methods(qwen3, trials, methods=["locos", "atp", "nope"])):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == ("unknown method 'nope'; use one of locos, wu, "
                                  "attention_spatial, headkv, headkv_anchor, dla, atp, "
                                  "qrhead, cri")
    assert len(METHODS) == 9
