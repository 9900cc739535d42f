"""QRHead (locos_tl.experiments.qrhead): hand-computed scores, a brute-force oracle from
full-sequence ``hook_pattern`` caches, the null-question calibration, where the question
is found, clear errors, the organism's ground truth, and the wiring (score_trials,
``locos score``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tolerances import assert_close_within, model_tol
from typer.testing import CliRunner

import locos_tl as lt
from locos_tl import Trial
from locos_tl.errors import TrialError
from locos_tl.experiments.qrhead import qr_scores, qrhead_heads, qrhead_trial, question_span

ORG = Path(__file__).resolve().parents[1] / "data" / "organisms" / "retrieval-2l"


def test_qr_scores_by_hand() -> None:
    rows = torch.zeros(1, 2, 2, 5, dtype=torch.float64)  # [layer, head, query, key]
    rows[0, 0] = torch.tensor([[0.1, 0.5, 0.2, 0.2, 0.0], [0.0, 0.3, 0.3, 0.4, 0.0]])
    rows[0, 1] = torch.tensor([[1.0, 0.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.0, 0.0, 0.0]])
    null = torch.zeros(1, 2, 1, 4, dtype=torch.float64)  # one null query token
    null[0, 0, 0] = torch.tensor([0.4, 0.1, 0.1, 0.4])
    null[0, 1, 0] = torch.tensor([0.0, 0.5, 0.5, 0.0])
    # span [1, 3): head 0: mean(0.7, 0.6) - 0.2 = 0.45; head 1: mean(0, 0.5) - 1.0 = -0.75
    torch.testing.assert_close(qr_scores(rows, null, (1, 3)),
                               torch.tensor([[0.45, -0.75]], dtype=torch.float64))
    # the release's outlier mask: per-token scores 20 x 1.0 and one -10.0: mean 0.476,
    # unbiased std 2.400, threshold -4.32 drops the -10 (sum 20, not 10)
    one = torch.cat([torch.ones(20), torch.tensor([-10.0])]).double().reshape(1, 1, 1, 21)
    zero = torch.zeros(1, 1, 1, 21, dtype=torch.float64)
    assert float(qr_scores(one, zero, (0, 21))) == pytest.approx(10.0)
    assert float(qr_scores(one, zero, (0, 21), outlier_mask=True)) == pytest.approx(20.0)


def _brute_force(model, tokens, span, q, null_ids):
    """QR from two full-sequence run_with_cache forwards: the prompt and the prompt up to
    the question with the null question in its place (no cache, no fork)."""
    a, b = q
    s, e = span
    names = lambda n: n.endswith("hook_pattern")  # noqa: E731
    with torch.no_grad():
        _, c = model.run_with_cache(torch.tensor([list(tokens)]), names_filter=names)
        _, cn = model.run_with_cache(torch.tensor([list(tokens[:a]) + list(null_ids)]),
                                     names_filter=names)
    out = []
    for l in range(int(model.cfg.n_layers)):
        p = c[f"blocks.{l}.attn.hook_pattern"][0].double()  # [head, query, key]
        pn = cn[f"blocks.{l}.attn.hook_pattern"][0].double()
        out.append(p[:, a:b, s:e].sum(-1).mean(-1) - pn[:, a:, s:e].sum(-1).mean(-1))
    return torch.stack(out)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "olmo2"])
def test_qrhead_equals_brute_force(windowed, arch) -> None:
    """Sliding windows of 8 (qwen3, gemma3) shorter than the prompt; GQA on all."""
    model = windowed(arch)
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (30,), generator=g).tolist()
    t = Trial(tokens=tokens, needle_span=(10, 14), answer="x",
              meta={"question_span": [20, 24]}).with_tokenizer(model)
    rec = qrhead_trial(model, t)
    assert rec["question_span"] == [20, 24] and rec["n_forwards"] == 2
    got = torch.tensor(rec["scores"]["qrhead"], dtype=torch.float64)
    want = _brute_force(model, tokens, (10, 14), (20, 24), rec["null_tokens"])
    assert want.abs().max() > 1e-3  # the question does look at the needle
    # attention probabilities summed over 4 keys, averaged over <= 4 queries, two runs
    assert_close_within(got, want, 4 * model_tol(model, want, n_tokens=30), f"{arch} QR")
    # the calibration is the difference of the two recorded masses
    torch.testing.assert_close(got, torch.tensor(rec["mass_question"], dtype=torch.float64)
                               - torch.tensor(rec["mass_null"], dtype=torch.float64))
    # the null run matters: scored against itself the question calibrates to 0 exactly
    same = qrhead_trial(model, t, null_question=tokens[20:24])
    assert torch.tensor(same["scores"]["qrhead"]).abs().max() == 0.0
    assert torch.tensor(same["mass_question"]).abs().max() > 1e-3


def test_question_found_from_text(qwen3) -> None:
    tok = qwen3.tokenizer
    question = "Which character has been to Dresden?"
    prompt = (f"The quick brown fox. Actually, Yuki lives next to the Semper Opera House. "
              f"The old man reads a book. Question: {question} Answer:")
    t = Trial.from_text(tok, prompt, "Actually, Yuki lives next to the Semper Opera House.",
                        "Yuki", meta={"question": question})
    a, b = question_span(tok, t)
    assert tok.decode(list(t.tokens[a:b])).strip() == question
    # without the prompt text: the same span by searching the tokens
    bare = Trial(tokens=t.tokens, needle_span=t.needle_span, answer="Yuki",
                 meta={"question": question})
    assert question_span(tok, bare) == (a, b)
    organism_like = Trial(tokens=t.tokens, needle_span=t.needle_span, answer="Yuki",
                          meta={"query_start": -3})
    assert question_span(tok, organism_like) == (t.n_tokens - 3, t.n_tokens)


def test_qrhead_errors(qwen3) -> None:
    tokens = list(range(5, 35))
    bare = Trial(tokens=tokens, needle_span=(5, 9), answer="x")
    with pytest.raises(TrialError, match="no question for QRHead"):
        qrhead_trial(qwen3, bare)
    absent = Trial(tokens=tokens, needle_span=(5, 9), answer="x",
                   meta={"question": "Who lives next to the Semper Opera House?"})
    with pytest.raises(TrialError, match="does not occur in its tokens"):
        qrhead_trial(qwen3, absent)
    before = Trial(tokens=tokens, needle_span=(20, 24), answer="x",
                   meta={"question_span": [10, 14]})
    with pytest.raises(TrialError, match=r"needle span \[20, 24\) is not before the question"):
        qrhead_trial(qwen3, before)
    outside = Trial(tokens=tokens, needle_span=(5, 9), answer="x",
                    meta={"question_span": [25, 40]})
    with pytest.raises(TrialError, match="question span"):
        qrhead_trial(qwen3, outside)
    ok = Trial(tokens=tokens, needle_span=(5, 9), answer="x", meta={"question_span": [20, 24]})
    with pytest.raises(TrialError, match="null question"):
        qrhead_trial(qwen3, ok, null_question=[])
    with pytest.raises(ValueError, match="unknown span"):
        qrhead_heads(qwen3, [ok], span="question")


def _asked(n: int) -> list[Trial]:
    """``n`` distinct trials with a question span after their needle."""
    return [Trial(tokens=list(range(5 + i, 35 + i)), needle_span=(5, 9), answer="x",
                  meta={"question_span": [20, 24]}) for i in range(n)]


def test_qrhead_refuses_bad_trials_before_any_forward(qwen3, forward_count) -> None:
    """Every trial is checked before the first forward pass: a last trial without a
    question is refused with no forward run (it was refused after the others' two
    forwards each), and two bad trials are named in one error."""
    good = _asked(3)
    bare = Trial(tokens=list(range(40, 70)), needle_span=(5, 9), answer="x")
    with pytest.raises(TrialError, match=rf"^qrhead_heads: trial 3 \({bare.trial_id}\): no "
                                         r"question for QRHead: give meta\['question'\]"):
        qrhead_heads(qwen3, [*good, bare], progress=False)
    after = Trial(tokens=list(range(50, 80)), needle_span=(20, 24), answer="x",
                  meta={"question_span": [10, 14]})
    with pytest.raises(TrialError) as err:
        lt.score_trials(qwen3, [good[0], after, good[1], bare], method="qrhead",
                        progress=False)
    assert str(err.value).splitlines() == [
        "score_trials: 2 of 4 trials cannot run:",
        f"  trial 1 ({after.trial_id}): the needle span [20, 24) is not before the question "
        "[10, 14): the question cannot attend to it",
        f"  trial 3 ({bare.trial_id}): no question for QRHead: give meta['question'] (its "
        "text), meta['question_span'] = [start, end) or meta['query_start']",
    ]
    assert forward_count.n == 0


def test_qrhead_under_no_grad_and_inference_mode(qwen3, grad_off) -> None:
    """QRHead needs no gradient: under each grad-off context it runs the same code on
    the same inputs, so its scores equal the plain call's bit for bit."""
    trials = _asked(2)
    plain = qrhead_heads(qwen3, trials, progress=False)
    with grad_off.context():
        got = qrhead_heads(qwen3, trials, progress=False)
        assert not torch.is_grad_enabled()
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    torch.testing.assert_close(got.trial_scores, plain.trial_scores, rtol=0, atol=0)


def test_qrhead_finds_the_organism_heads(organism) -> None:
    """The organism's question (``Q X``, meta ``query_start``) attends to the needle
    pair through the heads planted for it. Measured (12 trials, seed 3, 128 tokens):
    literal: (1, 7) 0.52, (1, 6) 0.49, (1, 4) 0.47, (1, 5) 0.45, next (1, 2) 0.25;
    non-literal: (1, 1) 0.62, (1, 0) 0.49, next (1, 2) 0.14."""
    from locos_tl.organisms.tasks import make_trials

    truth = json.loads((ORG / "ground_truth.json").read_text())
    for task, heads in (("literal", truth["literal_copy"]),
                        ("nonliteral", truth["nonliteral_writer"])):
        hs = qrhead_heads(organism, make_trials(task, 12, 128, seed=3), progress=False)
        assert hs.method == "qrhead" and hs.n_trials == 12
        assert set(hs.top_k(len(heads))) == {tuple(h) for h in heads}, task


def test_qrhead_dispatch_and_cli(organism, tmp_path) -> None:
    from locos_tl.cli import app
    from locos_tl.organisms.tasks import make_trials

    trials = make_trials("nonliteral", 3, 64, seed=5)
    direct = qrhead_heads(organism, trials, progress=False)
    via = lt.score_trials(organism, trials, method="qrhead", progress=False)
    torch.testing.assert_close(via.trial_scores, direct.trial_scores, rtol=0, atol=0)
    answer = lt.score_trials(organism, trials, method="qrhead", spans={"qrhead": "answer"},
                             progress=False)  # no answer span: the needle
    torch.testing.assert_close(answer.trial_scores, direct.trial_scores, rtol=0, atol=0)
    path = lt.save_trials(trials, tmp_path / "trials.jsonl")
    out = tmp_path / "run"
    args = ["score", "--model", str(ORG), "--trials", str(path), "--out", str(out),
            "--max-new-tokens", "2", "--method", "locos,atp,qrhead"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    for f in ("trials.jsonl", "meta.json", "locos/heads.json", "atp/trials.jsonl",
              "atp/heatmap.html", "qrhead/trials.jsonl", "qrhead/head_scores.json"):
        assert (out / f).exists(), f
    assert "atp: top 10 heads" in res.output and "qrhead: top 10 heads" in res.output
    torch.testing.assert_close(lt.load_head_scores(out, "qrhead").scores, direct.scores)
    again = CliRunner().invoke(app, args)  # resumes: every trial of every method reused
    assert again.exit_code == 0, again.output
    assert again.output.count("skipping 3 of 3") == 3, again.output
    res = CliRunner().invoke(app, [*args[:-1], "atp", "--workers", "2"])
    assert res.exit_code != 0 and "--workers 1" in res.output
