"""Bad input gets a clear error naming the problem: malformed ``Trial``
fields, one bare Trial where a list is expected, a bare string or ``None`` as
calibration prompts, and bad ``greedy_decode`` arguments. Each refusal is checked for
its type and message; the accepted neighbours are checked against the plain form."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from locos_tl.engine.ablation import calibrate_means
from locos_tl.engine.decode import greedy_decode
from locos_tl.errors import TrialError
from locos_tl.experiments.evaluate import ablation_sweep
from locos_tl.experiments.patching import patch_heads
from locos_tl.experiments.score import score_trials
from locos_tl.trials import Trial

GOOD = dict(tokens=[3, 4, 5, 6, 7, 8], needle_span=(1, 3), answer="Mary")


def make(**kw):
    return Trial(**{**GOOD, **kw})


@pytest.mark.parametrize("kw, match", [
    (dict(needle_span=None), r"Trial\.needle_span must be a \(start, end\) pair.*NoneType"),
    (dict(needle_span=(1,)), r"Trial\.needle_span must be a \(start, end\) pair.*1 value"),
    (dict(needle_span="13"), r"Trial\.needle_span must be a \(start, end\) pair.*str"),
    (dict(needle_span=(0.5, 2)), r"Trial\.needle_span start must be an integer, got float"),
    (dict(answer_span=(1, 2.0)), r"Trial\.answer_span end must be an integer, got float"),
    (dict(tokens="abc"), r"Trial\.tokens must be a sequence of token ids.*str 'abc'.*tokenize"),
    (dict(tokens=None), r"Trial\.tokens must be a sequence of token ids.*NoneType"),
    (dict(tokens=[]), r"empty prompt.*Trial\.tokens is empty"),
    (dict(tokens=[3, 4.0, 5, 6]), r"Trial\.tokens\[1\] must be an integer, got float 4\.0"),
    (dict(tokens=np.array([3.0, 4.0, 5.0])), r"Trial\.tokens\[0\] must be an integer"),
    (dict(tokens=[3, True, 5]), r"Trial\.tokens\[1\] must be an integer, got bool"),
    (dict(tokens=[3, -2, 5]), r"Trial\.tokens\[1\] = -2 is negative"),
])
def test_trial_fields_refused_by_name(kw, match):
    with pytest.raises(TrialError, match=match):
        make(**kw)


def test_trial_accepts_numpy_and_torch_integers():
    plain = make()
    for tokens, span in [(np.array(GOOD["tokens"]), np.array([1, 3])),
                         (torch.tensor(GOOD["tokens"]), (torch.tensor(1), torch.tensor(3)))]:
        t = make(tokens=tokens, needle_span=span)
        assert t.tokens == (3, 4, 5, 6, 7, 8) and t.needle_span == (1, 3)
        assert all(type(x) is int for x in t.tokens + t.needle_span)
        assert t.trial_id == plain.trial_id


def test_one_trial_instead_of_a_list_is_refused(qwen3):
    t = make()
    for call, name in [
        (lambda: score_trials(qwen3, t, progress=False), "score_trials"),
        (lambda: ablation_sweep(qwen3, t, {"m": [(0, 0)]}, mode="query_zero",
                                progress=False), "ablation_sweep"),
        (lambda: patch_heads(qwen3, t, progress=False), "patch_heads"),
    ]:
        with pytest.raises(TrialError, match=rf"{name}\(\) got one Trial: pass a list of "
                                             r"trials, e.g. \[trial\]"):
            call()
    with pytest.raises(TrialError, match=r"score_trials\(\): trials\[1\] is a dict, not a "
                                         "Trial: pass a list of trials"):
        score_trials(qwen3, [t, dict(GOOD)], progress=False)
    with pytest.raises(TrialError, match=r"patch_heads\(\) needs a list of trials, got str"):
        patch_heads(qwen3, "trials.jsonl", progress=False)


def test_calibrate_means_refuses_bare_string_none_and_trial(qwen3):
    with pytest.raises(TrialError, match=r"got one string: pass a list of prompts, e\.g\. "
                                         r"\[text\].*one prompt per character"):
        calibrate_means(qwen3, "some calibration text")
    with pytest.raises(TrialError, match=r"calibration prompt 0 is NoneType None: each "
                                         r"prompt is a raw text \(str\) or a list of token ids"):
        calibrate_means(qwen3, [None])
    with pytest.raises(TrialError, match=r"got one Trial: pass a list of prompts"):
        calibrate_means(qwen3, make())
    with pytest.raises(TrialError, match=r"calibration prompt 1 is a Trial: pass its tokens"):
        calibrate_means(qwen3, [[3, 4, 5], make()])
    with pytest.raises(TrialError, match=r"calibration prompt 0\[2\] must be an integer, "
                                         "got float"):
        calibrate_means(qwen3, [[3, 4, 5.5]])


def test_calibrate_means_token_forms_agree(qwen3):
    """numpy / torch id lists give the same means as a plain list (same tokens run)."""
    ids = [3, 9, 27, 81, 12, 40, 7]
    ref = calibrate_means(qwen3, [ids])
    for other in ([np.array(ids)], [torch.tensor(ids)], (tuple(ids),)):
        got = calibrate_means(qwen3, other)
        assert got.n_tokens == ref.n_tokens == len(ids)
        torch.testing.assert_close(got.q, ref.q, rtol=0, atol=0)
        torch.testing.assert_close(got.z, ref.z, rtol=0, atol=0)


def test_greedy_decode_refuses_text_floats_and_no_new_tokens(qwen3):
    with pytest.raises(TrialError, match=r"tokens must be a sequence of token ids.*str "
                                         "'hello'.*tokenize"):
        greedy_decode(qwen3, "hello")
    with pytest.raises(TrialError, match=r"tokens\[1\] must be an integer, got float"):
        greedy_decode(qwen3, [3, 4.5, 6])
    with pytest.raises(TrialError, match=r"integer token ids, got a torch\.float32 tensor"):
        greedy_decode(qwen3, torch.tensor([3.0, 4.0]))
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"max_new_tokens must be an integer >= 1, "
                                             rf"got {bad}"):
            greedy_decode(qwen3, [3, 4, 5], max_new_tokens=bad)


def test_greedy_decode_token_forms_agree(qwen3):
    """A list, a 1-D and a [1, N] long tensor decode identically; max_new_tokens=1
    generates exactly one token, the argmax of the HF forward's last logits."""
    ids = [3, 9, 27, 81, 12, 40, 7]
    ref = greedy_decode(qwen3, ids, max_new_tokens=4, stop_rule="none",
                        stop_at_eos=False)
    for other in (torch.tensor(ids), torch.tensor([ids]), np.array(ids)):
        res = greedy_decode(qwen3, other, max_new_tokens=4, stop_rule="none",
                            stop_at_eos=False)
        assert res.generated == ref.generated
    one = greedy_decode(qwen3, ids, max_new_tokens=1, stop_rule="none",
                        stop_at_eos=False)
    with torch.no_grad():
        logits = qwen3.original_model(torch.tensor([ids])).logits[0, -1]
    assert one.generated == [int(logits.argmax())]


def test_sweeps_refuse_bad_trials_before_any_forward(qwen3, forward_count):
    """The sweeps check every trial before the first forward pass: a bad last trial is
    refused with no forward run, by index and id (the ablation sweep asked for name
    margins and the compression sweep refused it after the other trials' decoding), and
    two bad trials are named in one error (the teacher-forced sweep named the first)."""
    from locos_tl.experiments.compress import compression_sweep
    from locos_tl.experiments.evaluate import ablation_sweep
    from locos_tl.experiments.teacher_forced import teacher_forced_sweep

    meta = {"distractor_names": ["Bob"], "query_start": 20}
    good = [Trial(tokens=list(range(5 + i, 35 + i)), needle_span=(5, 9), answer="Mary",
                  meta=meta).with_tokenizer(qwen3) for i in range(2)]
    bare = Trial(tokens=list(range(40, 70)), needle_span=(5, 9), answer="Mary"
                 ).with_tokenizer(qwen3)
    grid = dict(k=1, mode="query_zero", random=False, bottom=None, progress=False)
    with pytest.raises(TrialError, match=rf"^ablation_sweep: trial 2 \({bare.trial_id}\): no "
                                         "distractor names; build it with"):
        ablation_sweep(qwen3, [*good, bare], {"m": [(0, 0)]}, max_new_tokens=2,
                       name_margin=True, **grid)
    with pytest.raises(TrialError, match=rf"^compression_sweep: trial 2 \({bare.trial_id}\): "
                                         r"compressed decoding needs where the question starts"):
        compression_sweep(qwen3, [*good, bare], include=("uniform",), fractions=(0.5,),
                          max_new_tokens=2, progress=False)
    assert forward_count.n == 0
    n_ctx = int(qwen3.cfg.n_ctx)
    long = [Trial(tokens=[7 + i] * n_ctx, needle_span=(5, 9), answer="Mary")
            .with_tokenizer(qwen3) for i in range(2)]
    with pytest.raises(TrialError) as err:
        teacher_forced_sweep(qwen3, [long[0], good[0], long[1]], {"m": [(0, 0)]}, **grid)
    lines = str(err.value).splitlines()
    assert lines[0] == "teacher_forced_sweep: 2 of 3 trials cannot run:"
    for line, (i, t) in zip(lines[1:], ((0, long[0]), (2, long[1])), strict=True):
        assert re.fullmatch(rf"  trial {i} \({t.trial_id}\): prompt of "
                            rf"{n_ctx} tokens \+ a name of \d+ tokens is longer than the "
                            rf"model's context n_ctx={n_ctx}", line), line
    assert forward_count.n == 0
