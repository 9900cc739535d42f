"""Distractor trials: needles of other entries with other characters, recorded with
their names and spans; the contains-target / contains-distractor scores; the
teacher-forced name margin against a brute-force computation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from locos_tl.data import build_nolima_trials, expand_needle_set, load_needle_set
from locos_tl.data.haystack import PROSE_HAYSTACK, load_haystacks
from locos_tl.errors import TrialError
from locos_tl.experiments.margin import name_logprobs, name_margin, name_token_ids
from locos_tl.experiments.task_metrics import score_nolima


@pytest.fixture(scope="module")
def items():
    return expand_needle_set(load_needle_set("everyday"), ["onehop"])


def _build(tok, items, n, distractors, seed=0, length=480):
    return build_nolima_trials(tok, items, load_haystacks([PROSE_HAYSTACK]), lengths=[length],
                               depths=[20, 60], num_examples=n, seed=seed,
                               distractors=distractors)


def test_distractor_needles_are_other_entries_with_other_names(qwen3, items):
    tok = qwen3.tokenizer
    trials = _build(tok, items, 6, distractors=3)
    assert len(trials) == 6
    for t in trials:
        chars = t.meta["characters"]
        assert [c["role"] for c in chars] == ["target", "distractor", "distractor", "distractor"]
        names = [c["name"] for c in chars]
        assert len(set(names)) == 4 and names[0] == t.meta["character"] == t.answer
        assert t.meta["distractor_names"] == names[1:]
        entries = [c["entry_id"] for c in chars]
        assert len(set(entries)) == 4  # other entries: other facts
        assert chars[0]["span"] == list(t.needle_span)
        for c in chars:
            s, e = c["span"]
            text = tok.decode(list(t.tokens[s:e]))
            assert c["needle"] in text and c["name"] in text  # the span covers its needle
            assert t.prompt.count(c["needle"]) == 1
        spans = sorted(tuple(c["span"]) for c in chars)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))  # disjoint
    # deterministic; another seed draws other distractors
    again = _build(tok, items, 6, distractors=3)
    assert [t.meta["characters"] for t in again] == [t.meta["characters"] for t in trials]
    other = _build(tok, items, 6, distractors=3, seed=1)
    assert [t.meta["characters"] for t in other] != [t.meta["characters"] for t in trials]


def test_no_distractors_leaves_trials_as_they_were(qwen3, items):
    plain = _build(qwen3.tokenizer, items, 3, distractors=0)
    assert all("characters" not in t.meta and "insert_spans" not in t.meta for t in plain)


def test_too_many_distractors_is_a_clear_error(qwen3, items):
    from locos_tl.errors import DataFormatError

    few = [i for i in items if i.entry_id in {"0001", "0002"}]
    with pytest.raises(DataFormatError, match="2 distractor needles need 2 other entries"):
        _build(qwen3.tokenizer, few, 1, distractors=2)


def test_scores_name_target_and_distractors(qwen3, items):
    (t,) = _build(qwen3.tokenizer, items, 1, distractors=2)
    target, (d1, d2) = t.answer, t.meta["distractor_names"]
    assert score_nolima(f"It is {target}.", t) == pytest.approx(
        {"rougeL": score_nolima(f"It is {target}.", t)["rougeL"], "contains": 1.0,
         "contains_distractor": 0.0, "target_only": 1.0})
    both = score_nolima(f"{d2} or {target}", t)
    assert both["contains"] == 1.0 and both["contains_distractor"] == 1.0
    assert both["target_only"] == 0.0
    wrong = score_nolima(f"{d1}", t)
    assert wrong["contains"] == 0.0 and wrong["contains_distractor"] == 1.0


def _brute_logp(model, tokens, ids):
    """Sum of log P(ids[j] | prompt + ids[:j]), one plain HF forward per token."""
    hf = model.original_model
    total = 0.0
    for j, y in enumerate(ids):
        seq = torch.tensor([list(tokens) + list(ids[:j])])
        with torch.no_grad():
            logits = hf(seq).logits[0, -1].double()
        total += float(torch.log_softmax(logits, -1)[y])
    return total


def test_name_margin_equals_brute_force(qwen3, items):
    (t,) = _build(qwen3.tokenizer, items, 1, distractors=2, length=480)
    res = name_margin(qwen3, t)
    names = [t.answer, *t.meta["distractor_names"]]
    ids = [name_token_ids(qwen3.tokenizer, n) for n in names]
    want = [_brute_logp(qwen3, t.tokens, i) for i in ids]
    # float32 forwards of one batch against one-token-at-a-time forwards: summation
    # order only; a 480-token tiny model keeps it well under 1e-3 nats
    assert res["logp_target"] == pytest.approx(want[0], abs=1e-3)
    best = max(want[1:])
    assert res["logp_best_distractor"] == pytest.approx(best, abs=1e-3)
    assert res["name_margin"] == pytest.approx(want[0] - best, abs=2e-3)
    assert res["best_distractor"] == names[1 + want[1:].index(best)]


def test_name_margin_under_ablation_matches_the_bridge_hooks(qwen3, items):
    """Inside ``ablate`` the margin runs on the fast twin with module hooks; the
    TransformerBridge's own hooks (the reference) give the same log-probabilities."""
    import locos_tl as lt

    (t,) = _build(qwen3.tokenizer, items, 1, distractors=1, length=480)
    ids = [name_token_ids(qwen3.tokenizer, n) for n in [t.answer, *t.meta["distractor_names"]]]
    clean = name_logprobs(qwen3, t.tokens, ids)
    heads = [(0, 0), (1, 2), (1, 3)]
    with lt.ablate(qwen3, heads, "query_zero"):
        fast = name_logprobs(qwen3, t.tokens, ids)
        ref = []
        for i in ids:  # the bridge path, one name at a time
            seq = torch.tensor([list(t.tokens) + i[:-1]])
            with torch.no_grad():
                lp = torch.log_softmax(qwen3(seq, return_type="logits")[0].float(), -1)
            pos = torch.arange(len(t.tokens) - 1, len(t.tokens) - 1 + len(i))
            ref.append(float(lp[pos, torch.tensor(i)].sum()))
    assert torch.allclose(fast, torch.tensor(ref), atol=1e-3)
    assert not torch.allclose(fast, clean, atol=1e-3)  # the ablation changed them


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "olmo2"])
@pytest.mark.parametrize("decode_engine", ["twin", "bridge"])
def test_decoding_scores_the_names_from_its_prefill(windowed, items, arch, decode_engine):
    """``greedy_decode(score_continuations=...)`` reads each name's log-probability from
    a copy of the prefill's KV cache: the same values as a full forward of prompt + name
    (:func:`name_logprobs`), clean and under an ablation, on both engines and with
    sliding windows shorter than the prompt; the decoding itself is unchanged."""
    import locos_tl as lt
    from locos_tl.engine.decode import greedy_decode

    model = windowed(arch)
    (t,) = _build(model.tokenizer, items, 1, distractors=2, length=480)
    ids = [name_token_ids(model.tokenizer, n) for n in [t.answer, *t.meta["distractor_names"]]]
    assert max(len(i) for i in ids) > 1  # multi-token names go through the cache
    plain = greedy_decode(model, t.tokens, max_new_tokens=6)
    for heads in ([], [(0, 0), (1, 1)]):
        with lt.ablate(model, heads, "query_zero"):
            want = name_logprobs(model, t.tokens, ids)
            res = greedy_decode(model, t.tokens, max_new_tokens=6, score_continuations=ids,
                                decode_engine=decode_engine)
            again = greedy_decode(model, t.tokens, max_new_tokens=6,
                                  decode_engine=decode_engine)
        # float32, a cached attention against a full one: summation order only
        assert torch.allclose(torch.tensor(res.continuation_logprobs), want, atol=1e-3)
        assert res.generated == again.generated
    assert plain.continuation_logprobs is None
    with pytest.raises(TrialError, match="no tokens"):
        greedy_decode(model, t.tokens, max_new_tokens=2, score_continuations=[[]])


def test_margin_refuses_plain_trials_and_empty_names(qwen3, items):
    (t,) = _build(qwen3.tokenizer, items, 1, distractors=0)
    with pytest.raises(TrialError, match="no distractor names.*--distractors"):
        name_margin(qwen3, t)
    with pytest.raises(TrialError, match="tokenizes to nothing"):
        name_token_ids(qwen3.tokenizer, "")


def test_cli_builds_distractor_trials(tmp_path, tiny_dirs):
    from typer.testing import CliRunner

    from locos_tl.cli import app

    out = tmp_path / "t.jsonl"
    res = CliRunner().invoke(app, [
        "build-trials", "nolima", "--needle-set", "everyday", "--haystack",
        str(PROSE_HAYSTACK), "--tokenizer", str(tiny_dirs["qwen3"]), "--out", str(out),
        "--lengths", "480", "--depths", "50", "--num-examples", "2", "--question-type",
        "onehop", "--distractors", "1"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in Path(out).read_text().splitlines()]
    assert len(rows) == 2
    assert all(len(r["meta"]["distractor_names"]) == 1 for r in rows)


def test_detection_drops_a_trial_whose_answer_names_a_distractor(qwen3, own_answer_trials):
    """The gate passes (the answer names the target), but the response also names a
    distractor: every method drops the trial ("distractor"); a name it does not say
    leaves it accepted."""
    import dataclasses

    import locos_tl as lt
    from locos_tl.runs.trial import names_a_distractor

    t = own_answer_trials[0]
    first = lt.score_methods(qwen3, [t], methods=["locos", "wu"], max_new_tokens=8,
                             progress=False)
    assert first["locos"].meta["n_accepted"] == 1
    from locos_tl.engine.decode import greedy_decode

    response = greedy_decode(qwen3, t.tokens, max_new_tokens=8).text
    words = [w.strip(".,") for w in response.split() if t.answer not in w and w.strip(".,")]
    assert words, response
    named = dataclasses.replace(t, meta={**t.meta, "distractor_names": [words[0]]})
    unnamed = dataclasses.replace(t, meta={**t.meta, "distractor_names": ["Zyxwvut"]})
    assert names_a_distractor(named, response) and not names_a_distractor(unnamed, response)
    with pytest.warns(RuntimeWarning, match="no trial was accepted"):
        dropped = lt.score_methods(qwen3, [named], methods=["locos", "wu"], max_new_tokens=8,
                                   progress=False)
    for m in ("locos", "wu"):
        assert dropped[m].meta["n_accepted"] == 0
        assert dropped[m].meta["n_dropped_distractor"] == 1
    kept = lt.score_trials(qwen3, [unnamed], method="locos", max_new_tokens=8, progress=False)
    assert kept.meta["n_accepted"] == 1


def test_ablation_sweep_records_the_name_margin_under_each_ablation(qwen3, items, tmp_path):
    """Default on for distractor trials: every cell gets a ``name_margin`` metric, the
    mean over trials of :func:`name_margin` run inside that cell's ablation; it comes
    back from the records (``load_ablation_sweep``) unchanged."""
    import numpy as np

    import locos_tl as lt

    trials = _build(qwen3.tokenizer, items, 2, distractors=1, length=480)
    heads = [(1, 0), (1, 1)]
    df = lt.ablation_sweep(qwen3, trials, {"locos": heads}, k=[2], mode="query_zero",
                           random=False, bottom=None, max_new_tokens=4, progress=False,
                           out_dir=tmp_path / "abl")
    margin = df[df.metric == "name_margin"].set_index("method")["value"]
    base = np.mean([name_margin(qwen3, t)["name_margin"] for t in trials])
    with lt.ablate(qwen3, heads, "query_zero"):
        ablated = np.mean([name_margin(qwen3, t)["name_margin"] for t in trials])
    # the sweep reads the names from its decoding's prefill cache, name_margin from a
    # full forward: float32 summation order only
    assert margin["baseline"] == pytest.approx(base, abs=1e-3)
    assert margin["locos"] == pytest.approx(ablated, abs=1e-3)
    assert {"contains", "contains_distractor", "target_only"} <= set(df.metric)
    back = lt.load_ablation_sweep(tmp_path / "abl", trials)
    got = back[back.metric == "name_margin"].set_index("method")["value"]
    assert got.to_dict() == pytest.approx(margin.to_dict(), abs=1e-12)
    # a rerun on the same directory generates nothing and keeps the recorded margins
    again = lt.ablation_sweep(qwen3, trials, {"locos": heads}, k=[2], mode="query_zero",
                              random=False, bottom=None, max_new_tokens=4, progress=False,
                              out_dir=tmp_path / "abl")
    resumed = again[again.metric == "name_margin"].set_index("method")["value"]
    assert resumed.to_dict() == pytest.approx(margin.to_dict(), abs=1e-12)
    plain = lt.ablation_sweep(qwen3, trials, {"locos": heads}, k=[2], mode="query_zero",
                              random=False, bottom=None, max_new_tokens=4, progress=False,
                              name_margin=False)
    assert "name_margin" not in set(plain.metric)


def test_margin_refuses_a_prompt_longer_than_the_context(qwen3, items):
    (t,) = _build(qwen3.tokenizer, items, 1, distractors=1, length=600)
    with pytest.raises(TrialError, match="longer than the model's context n_ctx=512"):
        name_margin(qwen3, t)
