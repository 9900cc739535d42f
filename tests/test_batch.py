"""Batched trials give exactly batch size 1's records.

Every trial decoded in a batch (left padding, explicit positions, the twins) must give
the record :func:`locos_tl.runs.runner.run_trial` gives it alone: same generated tokens,
response, stop, acceptance and answer steps, and every method's per-trial scores and
step values equal to float32 summation order (``tests/tolerances.py``). Checked on
Qwen3 (one sliding-window layer), Gemma-3 (window 8, shorter than every prompt but
one), OLMo-2 and Llama, over trials of different prompt lengths (one shorter than the
window and the HeadKV anchor window), needle positions and stop steps, one batch holding
them all.
"""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl import Trial
from locos_tl.detectors import DETECTORS, get_detector
from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.options import DecodeOptions
from locos_tl.engine.unembed import AnswerDirections
from locos_tl.models.tiny import SHORT_WINDOWS
from locos_tl.runs.batch import batch_fallback_reason, run_trials_batched
from locos_tl.runs.runner import run_trial

NEW = 10
DECODE = DecodeOptions(max_new_tokens=NEW)
LENGTHS = (5, 12, 25, 40, 31, 18, 55, 23)


def mixed_trials(model) -> list[Trial]:
    """Up to 8 trials: lengths 5..55, needles near the start or the end, answers taken
    from the model's own greedy response (so the gate passes and scores exist), and
    at least one that stops (newline/EOS) well before ``NEW`` tokens."""
    out: list[Trial] = []
    early = 0
    for seed in range(400):
        n = LENGTHS[len(out) % len(LENGTHS)]
        g = torch.Generator().manual_seed(seed)
        toks = torch.randint(1, int(model.cfg.d_vocab) - 1, (n,), generator=g).tolist()
        res = greedy_decode(model, toks, max_new_tokens=NEW)
        words = re.findall(r"[A-Za-z]{3,}", res.text)
        span = (1, 4) if seed % 2 else (max(n - 9, 0), max(n - 5, 2))
        stops_early = res.stopped_by != "max_new_tokens" and len(res.generated) < NEW - 2
        if stops_early and early < 2:
            early += 1
        elif not words or len(out) - early >= 6:
            continue
        out.append(Trial(tokens=toks, needle_span=span, answer=words[0] if words else "zzz",
                         trial_id=f"s{seed}"))
        if len(out) == 8:
            break
    assert early >= 1, "no early-stopping prompt found"
    return out


def assert_same_record(model, a: dict, b: dict, n_tokens: int) -> None:
    """Equal records; scores and step values (sums over positions of phi or the pattern,
    4 sums after the layers) to float32 summation order (tests/tolerances.py)."""
    assert a.keys() == b.keys()
    for k in a:
        if k in ("scores", "step_values"):
            assert a[k].keys() == b[k].keys(), k
            for m in a[k]:
                if a[k][m] is None:
                    assert b[k][m] is None
                    continue
                ref = torch.tensor(a[k][m])
                assert_close_within(torch.tensor(b[k][m]), ref,
                                    model_tol(model, ref, n_tokens=n_tokens, reads=4),
                                    f"{k}[{m}]")
        else:
            assert a[k] == b[k], (k, a[k], b[k])


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_batched_records_equal_batch_size_1(windowed, arch):
    model = windowed(arch)
    assert batch_fallback_reason(model) is None
    trials = mixed_trials(model)
    detectors = [get_detector(m) for m in DETECTORS]
    dirs = AnswerDirections(model, "exact")  # norm scales read in the batch too
    ref = [run_trial(model, t, detectors, directions=dirs, decode=DECODE)
           for t in trials]
    seen: list[int] = []
    got = run_trials_batched(model, trials, detectors, directions=dirs, batch_size=8,
                             decode=DECODE, on_record=lambda i, r: seen.append(i))
    n = max(t.n_tokens for t in trials) + NEW
    for a, b in zip(ref, got, strict=True):
        assert_same_record(model, a, b, n)
    # the comparison is not vacuous: scores of every method, early and full stops
    assert all(any(r["scores"].get(m) for r in ref) for m in DETECTORS)
    lens = [len(r["generated"]) for r in ref]
    assert min(lens) < NEW - 2 and max(lens) == NEW
    assert len({t.n_tokens for t in trials}) >= 5
    if arch in ("qwen3", "gemma3"):
        assert max(t.n_tokens for t in trials) > 8 > min(t.n_tokens for t in trials)
    # records arrive as trials finish: an early stopper before the full-length ones
    first_full = min(seen.index(i) for i, n in enumerate(lens) if n == NEW)
    assert any(seen.index(i) < first_full for i, n in enumerate(lens) if n < NEW - 2)


def test_early_stopper_alone_and_in_a_batch(windowed):
    """A trial that stops after a few tokens gives its batch-size-1 record, whether its
    batch mates decode on for all ``NEW`` steps or not (raw variant, LOCOS only)."""
    model = windowed("gemma3")
    trials = mixed_trials(model)
    det = [get_detector("locos")]
    dirs = AnswerDirections(model, "raw")
    ref = [run_trial(model, t, det, directions=dirs, decode=DECODE) for t in trials]
    short = min(range(len(trials)), key=lambda i: len(ref[i]["generated"]))
    long_ = max(range(len(trials)), key=lambda i: len(ref[i]["generated"]))
    pair = [trials[long_], trials[short]]
    got = run_trials_batched(model, pair, det, directions=dirs, batch_size=2,
                             decode=DECODE)
    n = max(t.n_tokens for t in trials) + NEW
    assert_same_record(model, ref[long_], got[0], n)
    assert_same_record(model, ref[short], got[1], n)
    assert len(got[1]["generated"]) < len(got[0]["generated"])


@pytest.mark.parametrize("stop_rule", ["contains_newline", "none"])
def test_stop_rules_in_a_batch_equal_batch_size_1(windowed, stop_rule):
    """The batch stops each trial by the rule asked for, as batch size 1 does: under
    ``"none"`` a trial that stopped at a newline decodes on."""
    model = windowed("gemma3")
    trials = mixed_trials(model)
    det = [get_detector("locos")]
    dirs = AnswerDirections(model, "raw")
    decode = DecodeOptions(max_new_tokens=NEW, stop_rule=stop_rule)
    ref = [run_trial(model, t, det, directions=dirs, decode=decode)
           for t in trials]
    got = run_trials_batched(model, trials, det, directions=dirs, batch_size=8,
                             decode=decode)
    n = max(t.n_tokens for t in trials) + NEW
    for a, b in zip(ref, got, strict=True):
        assert_same_record(model, a, b, n)
    default = [run_trial(model, t, det, directions=dirs, decode=DECODE)
               for t in trials]
    by_newline = [i for i, r in enumerate(default) if r["stopped_by"] == "newline"]
    assert by_newline  # the comparison is not vacuous: a trial stops at a newline
    if stop_rule == "none":
        assert all(len(got[i]["generated"]) > len(default[i]["generated"]) for i in by_newline)
        assert "newline" not in {r["stopped_by"] for r in got}


def test_nan_trial_dropped_from_the_batch(windowed):
    """A trial whose logits turn NaN at step 0 gets batch size 1's non-finite record and
    leaves the batch; its batch mates decode on to their batch-size-1 records."""
    model = windowed("llama")
    trials = mixed_trials(model)[:4]
    det = [get_detector("locos")]
    dirs = AnswerDirections(model, "raw")
    fed = {tok for t in trials for tok in t.tokens}
    fed |= {tok for t in trials for tok in run_trial(model, t, det, directions=dirs,
                                                     decode=DECODE)["generated"]}
    magic = next(i for i in range(5, int(model.cfg.d_vocab)) if i not in fed)
    bad = Trial(tokens=[*trials[1].tokens[:-1], magic], needle_span=trials[1].needle_span,
                answer=trials[1].answer, trial_id="nan")
    batch = [trials[0], bad, *trials[2:]]
    emb = model.original_model.get_input_embeddings().weight
    saved = emb.data[magic].clone()
    emb.data[magic] = float("nan")
    try:
        with pytest.warns(RuntimeWarning, match="dropped .non_finite"):
            ref = [run_trial(model, t, det, directions=dirs, decode=DECODE)
                   for t in batch]
        with pytest.warns(RuntimeWarning, match="dropped .non_finite"):
            got = run_trials_batched(model, batch, det, directions=dirs, batch_size=4,
                                     decode=DECODE)
    finally:
        emb.data[magic] = saved
    n = max(t.n_tokens for t in batch) + NEW
    for a, b in zip(ref, got, strict=True):
        assert_same_record(model, a, b, n)
    assert got[1]["dropped"] == "non_finite"
    assert got[1]["non_finite"].startswith("decoding step 0: the logits hold NaN")
    assert all(r["dropped"] != "non_finite" and r["generated"] for r in got[:1] + got[2:])


def test_score_trials_batched_and_resumed(windowed, tmp_path, monkeypatch):
    import locos_tl.runs.batch as batch_mod
    from locos_tl import score_methods

    model = windowed("llama")
    trials = mixed_trials(model)
    methods = ["locos", "wu", "headkv_anchor"]
    one = score_methods(model, trials, methods=methods, max_new_tokens=NEW, progress=False)
    out = tmp_path / "run"
    many = score_methods(model, trials, methods=methods, max_new_tokens=NEW, progress=False,
                         batch_size=3, out_dir=out)
    n = max(t.n_tokens for t in trials) + NEW
    for m in methods:
        assert_close_within(many[m].scores, one[m].scores,
                            model_tol(model, one[m].scores, n_tokens=n, reads=4), m,
                            equal_nan=True)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["engine"]["batch_size"] == 3 and meta["engine"]["batch_reason"] is None
    # resume: drop three finished records; only those three are decoded again, batched
    lines = (out / "trials.jsonl").read_text().splitlines()
    kept, dropped = lines[:-3], [json.loads(x)["trial_id"] for x in lines[-3:]]
    (out / "trials.jsonl").write_text("\n".join(kept) + "\n")
    calls: list[list[str]] = []
    real = batch_mod.run_trials_batched

    def spy(model, trials, *a, **kw):
        calls.append([t.trial_id for t in trials])
        return real(model, trials, *a, **kw)

    monkeypatch.setattr(batch_mod, "run_trials_batched", spy)
    again = score_methods(model, trials, methods=methods, max_new_tokens=NEW, progress=False,
                          batch_size=3, out_dir=out)
    assert [sorted(c) for c in calls] == [sorted(dropped)]
    for m in methods:
        assert_close_within(again[m].scores, one[m].scores,
                            model_tol(model, one[m].scores, n_tokens=n, reads=4), m,
                            equal_nan=True)


def test_hook_falls_back_to_batch_size_1(windowed):
    model = windowed("qwen3")
    trials = mixed_trials(model)[:3]
    det = [get_detector("attention_spatial")]
    ref = [run_trial(model, t, det, directions=None, decode=DECODE) for t in trials]
    seen = []

    def look(pattern, hook):
        seen.append(hook.name)

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", look)]):
        assert "TransformerLens hook" in batch_fallback_reason(model)
        with pytest.warns(RuntimeWarning, match="falls back to batch size 1"):
            got = run_trials_batched(model, trials, det, directions=None, batch_size=4,
                                     decode=DECODE)
    assert seen  # the user's hook fired: the bridge ran
    n = max(t.n_tokens for t in trials) + NEW
    for a, b in zip(ref, got, strict=True):
        assert_same_record(model, a, b, n)
    with pytest.warns(RuntimeWarning, match="prefill_mode='bridge'"):
        run_trials_batched(model, trials[:1], det, directions=None, batch_size=2,
                           decode=DecodeOptions(max_new_tokens=2, prefill_mode="bridge"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert batch_fallback_reason(model) is None  # hooks removed: batching again


def test_bad_batch_size(windowed):
    from locos_tl import score_trials

    model = windowed("olmo2")
    trials = [Trial(tokens=[5, 6, 7, 8, 9, 10], needle_span=(1, 3), answer="x")]
    with pytest.raises(ValueError, match="batch_size"):
        score_trials(model, trials, batch_size=0, progress=False)
