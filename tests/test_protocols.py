"""Per-method protocols: spans, HeadKV's two forms, acceptance.

Values are checked against independent recomputations: attention rows and phi from a
full forward (``phi_from_model``, no KV cache, no prefill twin) and hand-built rows.
"""

from __future__ import annotations

import json
import re
import warnings
from collections import Counter
from string import punctuation

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial, phi_from_model, score_methods, score_trials
from locos_tl.acceptance import acceptance_counts, method_accepted
from locos_tl.data.packaged import book_path, niah_probes_path
from locos_tl.detectors import DETECTORS, HeadKV, HeadKVAnchor, TrialOutcome, get_detector
from locos_tl.engine.answers import answer_steps, rouge1_recall
from locos_tl.engine.decode import greedy_decode
from locos_tl.experiments.score import finished_record
from locos_tl.runs.records import RecordStore

NIAH_FILE = niah_probes_path()  # shipped with locos_tl
BOOK = book_path("dracula_part1")
ALL = ["locos", "wu", "headkv", "headkv_anchor", "attention_spatial", "dla"]


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def niah(qwen3):
    """(probes, NIAH trials of 300 tokens on the tiny Qwen3's tokenizer)."""
    from locos_tl.data import build_niah_trials, load_haystacks
    from locos_tl.data.niah import load_niah_probes

    probes = load_niah_probes(NIAH_FILE)
    trials = build_niah_trials(qwen3.tokenizer, probes, load_haystacks([BOOK]),
                               lengths=[300], depths=[50])
    return probes, trials


def _norm(text: str) -> str:
    return text.strip().rstrip(".").lower()


@pytest.fixture(scope="module")
def scored_niah(qwen3, niah):
    """A NIAH trial (both spans from the builder) whose gold answer is the first word of
    the tiny model's own response (which has two words at least), so every method has
    accepted steps to score."""
    _, trials = niah
    for t in trials:
        res = greedy_decode(qwen3, t.tokens, max_new_tokens=8)
        words = list(dict.fromkeys(re.findall(r"[A-Za-z]{3,}", res.text)))
        if len(words) >= 2:
            return Trial(tokens=t.tokens, needle_span=t.needle_span, answer=words[0],
                         answer_span=t.answer_span, meta=t.meta), res
    raise RuntimeError("no NIAH prompt with a word in the tiny model's response")


def _rows(model, ctx, q, target):
    phi, pat = phi_from_model(model, ctx, target, query_pos=q, return_pattern=True)
    return phi.double(), pat.double()


def _score_tol(model, rows, n_tokens):
    """Float32 summation-order tolerance of a detector score (tests/tolerances.py): sums
    over positions of phi or the pattern (4 sums after the layers), whose partial sums
    are bounded by ``sum_j |phi_j|`` (or the pattern's sum, 1)."""
    scale = max(max(float(phi.abs().sum(-1).max()), float(pat.abs().sum(-1).max()))
                for phi, pat in rows)
    return model_tol(model, scale, n_tokens=n_tokens, reads=4)


def _contrast(x, s, e):
    n, N = e - s, x.shape[-1]
    plus = x[..., s:e].sum(-1)
    return plus - (x.sum(-1) - plus) * n / (N - n)


def _f1(pred: str, gold: str) -> float:  # LongBench qa_f1_score, written out again
    def norm(t: str) -> list[str]:
        t = "".join(c for c in t.lower() if c not in set(punctuation))
        return re.sub(r"\b(a|an|the)\b", " ", t).split()

    p, g = norm(pred), norm(gold)
    same = sum((Counter(p) & Counter(g)).values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(g)
    return 2 * prec * rec / (prec + rec)


# ------------------------------------------------------------------ spans
def test_niah_trial_spans_are_hand_checked(qwen3, niah):
    probes, trials = niah
    tok = qwen3.tokenizer
    assert len(trials) == len(probes) == 3
    for t in trials:
        p = probes[t.meta["probe"] - 1]
        s, e = t.needle_span
        a, b = t.answer_span
        assert tok.decode(list(t.tokens[s:e])).strip() == p.needle  # the whole sentence
        assert _norm(tok.decode(list(t.tokens[a:b]))) == _norm(p.real_needle)
        assert s <= a < b <= e and (b - a) < (e - s)
        # each method's default span, as the authors publish it
        assert t.span("needle") == (s, e) and t.span("answer") == (a, b)
    defaults = {m: get_detector(m).span for m in ALL}
    assert defaults == {"locos": "needle", "attention_spatial": "needle", "dla": "needle",
                        "headkv_anchor": "needle", "wu": "answer", "headkv": "answer"}
    assert get_detector("locos", span="answer").span == "answer"
    assert get_detector("locos").span == "needle"  # an override does not leak to the class
    with pytest.raises(ValueError, match="unknown span"):
        get_detector("wu", span="sentence")


def test_each_method_reads_its_span_end_to_end(qwen3, scored_niah):
    """All six methods in one pass on a NIAH trial, each against an independent
    recomputation on the span it should read."""
    t, res = scored_niah
    tok = qwen3.tokenizer
    s, e = t.needle_span
    a, b = t.answer_span
    hs = score_methods(qwen3, [t], methods=ALL, max_new_tokens=8, progress=False)
    gen = res.generated
    steps = answer_steps(tok, gen, t.answer)
    assert steps and rouge1_recall(res.text, t.answer) > 0.5
    per = [_rows(qwen3, list(t.tokens) + gen[:i], -1, gen[i]) for i in range(len(gen))]

    loc = torch.stack([_contrast(per[i][0], s, e) for i in steps]).mean(0)
    spatial = torch.stack([_contrast(per[i][1], s, e) for i in steps]).mean(0)
    dla = torch.stack([per[i][0].sum(-1) for i in steps]).mean(0)
    wu = torch.zeros_like(dla)
    for i, (_, pat) in enumerate(per):
        top = pat.argmax(-1)
        ctx = torch.tensor(list(t.tokens) + gen[:i])
        wu += ((top >= a) & (top < b) & (ctx[top] == gen[i])).double() / (b - a)
    tol = _score_tol(qwen3, per, t.n_tokens + len(gen))
    for name, want in [("locos", loc), ("attention_spatial", spatial), ("dla", dla),
                       ("wu", wu)]:
        assert_close_within(hs[name].scores, want, tol, name)
        assert hs[name].meta["span"] == get_detector(name).span
    assert hs["wu"].meta["span"] == "answer" and hs["locos"].meta["span"] == "needle"
    # the same LOCOS on the answer span differs: the span really is per method
    first = per[steps[0]][0]
    assert (_contrast(first, a, b) - _contrast(first, s, e)).abs().max() > 10 * tol

    # HeadKV as published: first |answer| tokens, answer span, QA-F1 gate
    n = len(tok.encode(t.answer, add_special_tokens=False))
    prefix = tok.decode(gen[:n], skip_special_tokens=True).strip()
    assert _f1(prefix, t.answer) > 0.5  # the answer is the response's first word
    want = torch.zeros_like(dla)
    for i in range(min(n, len(gen))):
        vals, idx = per[i][1].topk(b - a, dim=-1)
        want += (vals * ((idx >= a) & (idx < b))).sum(-1) / (b - a)
    assert_close_within(hs["headkv"].scores, want, tol, "headkv")
    assert hs["headkv"].meta["span"] == "answer" and hs["headkv"].meta["n_accepted"] == 1
    assert n < len(gen)  # fewer steps than the free decode: the truncation is exercised

    # HeadKV anchor: prompt rows only, last 8 positions, whole-needle mass, max
    N = t.n_tokens
    masses = torch.stack([_rows(qwen3, list(t.tokens), q, 0)[1][..., s:e].sum(-1)
                          for q in range(N - 8, N)])
    # pattern masses: partial sums at most 1
    assert_close_within(hs["headkv_anchor"].scores, masses.amax(0),
                        model_tol(qwen3, 1.0, n_tokens=N, reads=4), "headkv_anchor")
    assert hs["headkv_anchor"].meta["span"] == "needle"


def test_span_override_per_call(qwen3, scored_niah):
    t, res = scored_niah
    a, b = t.answer_span
    hs = score_methods(qwen3, [t], methods=["locos"], spans={"locos": "answer"},
                       max_new_tokens=8, progress=False)["locos"]
    steps = answer_steps(qwen3.tokenizer, res.generated, t.answer)
    gen = res.generated
    rows = [_rows(qwen3, list(t.tokens) + gen[:i], -1, gen[i]) for i in steps]
    want = torch.stack([_contrast(phi, a, b) for phi, _ in rows]).mean(0)
    assert_close_within(hs.scores, want, _score_tol(qwen3, rows, t.n_tokens + len(gen)),
                        "locos on the answer span")
    assert hs.meta["span"] == "answer" and hs.meta["settings"]["spans"] == {"locos": "answer"}
    with pytest.raises(ValueError, match="not scored"):
        score_methods(qwen3, [t], methods=["locos"], spans={"wu": "answer"}, progress=False)
    with pytest.raises(ValueError, match="use 'needle' or 'answer'"):
        score_methods(qwen3, [t], methods=["locos"], spans={"locos": "x"}, progress=False)


def test_old_trial_files_still_load(tmp_path, niah):
    _, trials = niah
    t = trials[0]
    # a NIAH record as written before answer spans: needle_span held real_needle
    old = t.to_dict()
    del old["answer_span"]
    old["needle_span"] = list(t.answer_span)
    old["trial_id"] = ""
    legacy_id = Trial(tokens=t.tokens, needle_span=t.answer_span, answer=t.answer).trial_id
    with pytest.warns(UserWarning, match="rebuild the trials"):
        got = Trial.from_dict(old)
    assert got.needle_span == got.answer_span == t.answer_span
    assert got.trial_id == legacy_id  # ids of old trials do not change
    # a non-NIAH record without the field: no answer span, "answer" is the needle span
    plain = {"tokens": [1, 2, 3, 4], "needle_span": [1, 3], "answer": "x"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = Trial.from_dict(plain)
    assert p.answer_span is None and p.span("answer") == (1, 3)
    # round trip of a new trial keeps both spans, and the id sees the answer span
    back = Trial.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t and back.answer_span == t.answer_span
    assert Trial(tokens=t.tokens, needle_span=t.needle_span, answer=t.answer).trial_id \
        != Trial(tokens=t.tokens, needle_span=t.needle_span, answer=t.answer,
                 answer_span=t.answer_span).trial_id
    with pytest.raises(Exception, match="answer span"):
        Trial(tokens=(1, 2, 3), needle_span=(0, 1), answer="x", answer_span=(2, 9))


def test_wu_gate_equals_rouge_against_real_needle(niah):
    """Wu et al.'s gate is ROUGE-1 recall against ``real_needle``; the project's gold
    answer for NIAH is ``real_needle`` as located in the needle: the same score."""
    probes, _ = niah
    for p in probes:
        words = p.needle.split()
        for resp in (p.needle, " ".join(words[: len(words) // 2]), p.real_needle.upper(),
                     "nothing of it"):
            assert rouge1_recall(resp, p.answer) == rouge1_recall(resp, p.real_needle)


# ------------------------------------------------------------------ HeadKV
class _WordTok:
    """Whitespace tokenizer over a fixed word list (ids = positions)."""

    words = ["<eos>", "red", "fox", "cat", "runs", "."]

    def encode(self, text, add_special_tokens=False):
        return [self.words.index(w) for w in text.split()]

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.words[i] for i in ids
                        if not (skip_special_tokens and self.words[i] == "<eos>"))


def _outcome(generated, answer="red fox", start=0):
    return TrialOutcome(generated=generated, response="", answer=answer, rouge1_recall=1.0,
                        answer_steps=[], gate_threshold=0.5, tokenizer=_WordTok(),
                        response_start=start)


def test_headkv_published_steps_gate_and_sum():
    det = HeadKV()
    # answer "red fox" = 2 tokens: only the first 2 generated steps count
    ok = _outcome([1, 2, 4, 5])
    assert det.used_steps(ok) == [0, 1] and det.drop_reason(ok) is None  # F1 = 1
    values = torch.tensor([[[0.5, 0.1]], [[0.25, 0.0]], [[9.0, 9.0]], [[9.0, 9.0]]])
    used = det.used_steps(ok)
    torch.testing.assert_close(det.trial_score(values[used]), torch.tensor([[0.75, 0.1]]))
    # "red cat": F1 = 0.5, not > 0.5 -> dropped by HeadKV's gate, whatever ROUGE says
    assert det.drop_reason(_outcome([1, 3, 2])) == "gate"
    # after a thinking block the count starts at the response
    assert det.used_steps(_outcome([4, 4, 1, 2, 5], start=2)) == [2, 3]
    assert det.drop_reason(_outcome([4, 4, 1, 2, 5], start=2)) is None
    # a response shorter than the answer: every step it has
    assert det.used_steps(_outcome([1])) == [0]


def test_headkv_anchor_is_the_window_max_of_needle_mass():
    det = HeadKVAnchor()
    assert det.prompt_window == 8 and det.drop_reason(_outcome([3])) is None
    # one layer, 2 heads, 7 prompt rows over P = 10 keys, span [2, 4)
    rows = torch.zeros(2, 7, 10)
    rows[0, :, 0] = 1.0  # head 0: no needle mass in the prompt rows ...
    rows[1, 3, 2], rows[1, 3, 3], rows[1, 3, 9] = 0.3, 0.4, 0.3  # head 1: 0.7 at row 3
    rows[1, 5, 2], rows[1, 5, 0] = 0.2, 0.8
    pv = det.prompt_value(rows, (2, 4))
    torch.testing.assert_close(pv[1], torch.tensor([0.0, 0.0, 0.0, 0.7, 0.0, 0.2, 0.0]))
    step0 = torch.tensor([[[0.6, 0.1]]])  # [1 step, 1 layer, 2 heads]: the last position
    got = det.trial_score(step0, prompt_values=pv.unsqueeze(0))
    torch.testing.assert_close(got, torch.tensor([[0.6, 0.7]]))  # ... but 0.6 at N-1


def test_headkv_anchor_rows_on_sliding_window_layers(tiny_dirs, tmp_path):
    """Prefill rows of the last prompt positions are aligned to absolute keys on a
    Gemma-3 whose sliding window (6) is shorter than the prompt."""
    from locos_tl import load_model
    from locos_tl.models.tiny import byte_bpe_tokenizer, make_tiny_checkpoint

    path = make_tiny_checkpoint("gemma3", tmp_path / "g", seed=3,
                                tokenizer=byte_bpe_tokenizer(), sliding_window=6)
    model = load_model(path, device="cpu")
    tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (30,),
                           generator=torch.Generator().manual_seed(0)).tolist()
    t = Trial(tokens=tokens, needle_span=(20, 25), answer="zzz")
    hs = score_trials(model, [t], method="headkv_anchor", max_new_tokens=2, progress=False)
    masses = torch.stack([_rows(model, tokens, q, 0)[1][..., 20:25].sum(-1)
                          for q in range(22, 30)])
    assert_close_within(hs.scores, masses.amax(0), model_tol(model, 1.0, n_tokens=30, reads=4),
                        "headkv_anchor")
    assert hs.meta["n_accepted"] == 1  # no gate: a failing trial still counts


# ------------------------------------------------------------------ acceptance
def test_gate_passes_without_answer_step(qwen3, scored_niah, tmp_path):
    """Wu counts a trial whose gate passes with no answer step; LOCOS does not."""
    t_ok, res = scored_niah
    words = list(dict.fromkeys(re.findall(r"[A-Za-z]{3,}", res.text)))
    assert len(words) >= 2
    answer = f"{words[0]} {words[1]} zzzqqq"  # 2 of 3 words: recall 2/3 > 0.5
    t_no = Trial(tokens=t_ok.tokens, needle_span=t_ok.needle_span, answer=answer,
                 answer_span=t_ok.answer_span, meta=t_ok.meta)
    assert rouge1_recall(res.text, answer) > 0.5
    assert answer_steps(qwen3.tokenizer, res.generated, answer) == []
    out = tmp_path / "run"
    methods = ["locos", "wu", "headkv_anchor", "attention_spatial"]
    hs = score_methods(qwen3, [t_ok, t_no], methods=methods, max_new_tokens=8, out_dir=out,
                       progress=False)
    assert hs["locos"].meta["n_accepted"] == 1
    assert hs["locos"].meta["n_dropped_no_answer_step"] == 1
    assert hs["attention_spatial"].meta["n_accepted"] == 1
    assert hs["wu"].meta["n_accepted"] == 2 and hs["wu"].trial_ids == [t_ok.trial_id,
                                                                       t_no.trial_id]
    assert hs["headkv_anchor"].meta["n_accepted"] == 2
    # Wu's score of the no-answer-step trial: copy hits over every step, answer span
    a, b = t_no.answer_span
    gen = res.generated
    want = torch.zeros(int(qwen3.cfg.n_layers), int(qwen3.cfg.n_heads), dtype=torch.float64)
    for i in range(len(gen)):
        top = _rows(qwen3, list(t_no.tokens) + gen[:i], -1, gen[i])[1].argmax(-1)
        ctx = torch.tensor(list(t_no.tokens) + gen[:i])
        want += ((top >= a) & (top < b) & (ctx[top] == gen[i])).double() / (b - a)
    torch.testing.assert_close(hs["wu"].trial_scores[1], want)
    rec = [r for r in hs["wu"].records if r["trial_id"] == t_no.trial_id][0]
    assert rec["dropped"] == "no_answer_step" and not rec["accepted"]
    assert rec["dropped_by"] == {"locos": "no_answer_step", "wu": None,
                                 "headkv_anchor": None,
                                 "attention_spatial": "no_answer_step"}
    assert "locos" not in rec["scores"] and "wu" in rec["scores"]
    # counts per method in meta.json too
    acc = json.loads((out / "meta.json").read_text())["acceptance"]
    assert {m: acc[m]["n_accepted"] for m in methods} == {
        "locos": 1, "wu": 2, "headkv_anchor": 2, "attention_spatial": 1}
    # the run directory's loader applies the same per-method rule
    from locos_tl.runs.rundir import load_head_scores

    assert load_head_scores(out, "wu").meta["n_accepted"] == 2
    assert load_head_scores(out, "locos").n_trials == 1


def test_acceptance_of_old_records_and_resume_rules(tmp_path):
    old_acc = {"trial_id": "a", "accepted": True, "dropped": None, "scores": {"locos": 1}}
    old_gate = {"trial_id": "b", "accepted": False, "dropped": "gate", "scores": {}}
    new = {"trial_id": "c", "accepted": False, "dropped": "no_answer_step",
           "dropped_by": {"locos": "no_answer_step", "wu": None},
           "spans": {"locos": "needle", "wu": "answer"}, "scores": {"wu": 0.0}}
    recs = [old_acc, old_gate, new]
    assert [method_accepted(r, "wu") for r in recs] == [True, False, True]
    assert acceptance_counts(recs, "locos") == {
        "n_trials": 3, "n_accepted": 1, "n_dropped_gate": 1, "n_dropped_no_answer_step": 1,
        "n_dropped_non_finite": 0}
    assert acceptance_counts(recs, "wu")["n_accepted"] == 2

    store = RecordStore(tmp_path / "run", {"model": "m"})
    for r in recs:
        store.append(r)

    t = Trial(tokens=(1, 2, 3), needle_span=(0, 1), answer="x", trial_id="c")
    assert finished_record(store, t, ["locos", "wu"]) == new
    assert finished_record(store, t, ["locos", "wu"], {"locos": "needle"}) == new
    assert finished_record(store, t, ["locos"], {"locos": "answer"}) is None  # other span
    assert finished_record(store, t, ["locos", "headkv"]) is None  # new method
    old = Trial(tokens=(1, 2, 3), needle_span=(0, 1), answer="x", trial_id="a")
    assert finished_record(store, old, ["locos"]) is None  # pre-acceptance record reruns


def test_every_registered_detector_declares_a_protocol():
    for name, cls in DETECTORS.items():
        det = cls()
        assert det.name == name and det.span in ("needle", "answer")
        assert det.steps in ("answer", "all", "prompt")
        assert cls.__doc__ and "arXiv" in cls.__doc__


def test_the_registry_declares_each_method_as_it_runs():
    """Each decode-pass entry of the registry is a detector of ``DETECTORS`` with the span
    that detector reads; each own-pass entry is its function, taking every option the
    registry says ``score_methods`` hands it."""
    import inspect

    from locos_tl.detectors import SPAN_NAMES
    from locos_tl.experiments.atp import atp_heads
    from locos_tl.experiments.methods import METHODS, SPANS, method_names
    from locos_tl.experiments.patching import patch_heads
    from locos_tl.experiments.qrhead import qrhead_heads

    assert SPANS == SPAN_NAMES
    assert set(method_names("decode_pass")) == set(DETECTORS)
    for name in method_names("decode_pass"):
        m = METHODS[name]
        assert m.detector_class() is DETECTORS[name]
        assert m.default_span == DETECTORS[name].span and m.spans == SPAN_NAMES
    assert METHODS["headkv_anchor"].variant_of == "headkv"
    functions = {"atp": atp_heads, "qrhead": qrhead_heads, "cri": patch_heads}
    assert method_names("own_passes") == tuple(functions)
    for name, fn in functions.items():
        m = METHODS[name]
        assert m.function() is fn
        taken = set(inspect.signature(fn).parameters)
        assert set(m.options) <= taken and (not m.spans or "span" in taken), name
    with pytest.raises(TypeError, match="rides the shared decode pass"):
        METHODS["locos"].function()


def test_run_trial_hands_each_method_its_span(qwen3, scored_niah, monkeypatch):
    """Spy on the span every detector receives (the Wu copy score of a random-init
    model is 0 on either span, so its value alone cannot tell the spans apart)."""
    t, _ = scored_niah
    seen: dict[str, set] = {m: set() for m in ALL}
    for m in ALL:
        cls = DETECTORS[m]
        for meth in ("step_value", "prompt_value"):
            if meth == "prompt_value" and not cls.prompt_window:
                continue
            real = getattr(cls, meth)

            def spy(self, x, span, _real=real, _m=m):
                seen[_m].add(tuple(span))
                return _real(self, x, span)

            monkeypatch.setattr(cls, meth, spy)
    score_methods(qwen3, [t], methods=ALL, max_new_tokens=3, progress=False)
    needle, answer = {tuple(t.needle_span)}, {tuple(t.answer_span)}
    assert seen == {"locos": needle, "attention_spatial": needle, "dla": needle,
                    "headkv_anchor": needle, "wu": answer, "headkv": answer}
    for m in seen:
        seen[m].clear()
    score_methods(qwen3, [t], methods=["wu", "locos"], spans={"wu": "needle", "locos": "answer"},
                  max_new_tokens=3, progress=False)
    assert seen["wu"] == needle and seen["locos"] == answer
