"""Stop rule and reasoning blocks (docs/concepts.md "From steps to a
head score"), with forced tokens on a tiny Qwen3 whose tokenizer has ``.\\n``,
``\\n\\n``, ``<think>`` and ``</think>`` tokens besides the bare ``\\n``."""

from __future__ import annotations

import pytest

from locos_tl.engine.answers import answer_steps, response_start, think_token_ids
from locos_tl.engine.decode import DecodeStep, greedy_decode
from locos_tl.engine.stops import check_stop_rule, is_newline_stop


@pytest.fixture(scope="module")
def think_model(tmp_path_factory):
    from locos_tl import load_model
    from locos_tl.models.tiny import byte_bpe_tokenizer, make_tiny_checkpoint

    tok = byte_bpe_tokenizer()
    tok.add_tokens([".\n", "\n\n", "<think>", "</think>"])
    d = make_tiny_checkpoint("qwen3", tmp_path_factory.mktemp("think") / "m", seed=2,
                             tokenizer=tok)
    return load_model(d, device="cpu")


@pytest.fixture(scope="module")
def ids(think_model):
    tok = think_model.tokenizer

    def one(text):
        out = tok.encode(text, add_special_tokens=False)
        assert len(out) == 1, (text, out)
        return out[0]

    return {name: one(text) for name, text in {
        "nl": "\n", "dot_nl": ".\n", "nl2": "\n\n", "open": "<think>", "close": "</think>",
        "yuki": " Yuki", "the": " the", "book": " book"}.items()} | {"eos": tok.eos_token_id}


PROMPT = [5, 6, 7, 8, 9, 10]


def _decode(model, forced, **kw):
    steps: list[DecodeStep] = []
    res = greedy_decode(model, PROMPT, max_new_tokens=50, forced_tokens=forced,
                        on_step=steps.append, **kw)
    return res, steps


def test_stop_rule_hand_cases():
    assert is_newline_stop("\n")
    assert not is_newline_stop(".\n")
    assert not is_newline_stop("\n\n")
    assert not is_newline_stop(" Yuki")
    assert is_newline_stop(".\n", "contains_newline")
    assert is_newline_stop("\n\n", "contains_newline")
    assert not is_newline_stop(" Yuki", "contains_newline")
    with pytest.raises(ValueError, match="stop rule"):
        is_newline_stop("\n", "newline")
    with pytest.raises(ValueError, match="stop rule"):
        check_stop_rule("newline")
    assert check_stop_rule("contains_newline") == "contains_newline"


def test_only_the_bare_newline_token_stops(think_model, ids):
    tok = think_model.tokenizer
    forced = [ids["yuki"], ids["dot_nl"], ids["the"], ids["nl2"], ids["book"], ids["nl"],
              ids["the"]]
    res, _ = _decode(think_model, forced)
    assert res.stopped_by == "newline"
    assert res.generated == forced[:6]  # the stop token is generated ...
    assert res.text == "Yuki.\n the\n\n book".strip()  # ... but not part of the response
    assert res.text == tok.decode(forced[:5]).strip()
    assert res.response_start == 0 and res.thinking == ""

    old, _ = _decode(think_model, forced, stop_rule="contains_newline")
    assert old.stopped_by == "newline"
    assert old.generated == forced[:2]
    assert old.text == "Yuki"

    free, _ = _decode(think_model, forced, stop_rule="none")
    assert free.stopped_by == "max_new_tokens" and free.generated == forced

    eos, _ = _decode(think_model, [ids["yuki"], ids["eos"], ids["the"]])
    assert eos.stopped_by == "eos" and eos.generated == [ids["yuki"], ids["eos"]]
    assert eos.text == "Yuki"


def test_thinking_block_is_skipped(think_model, ids):
    tok = think_model.tokenizer
    assert think_token_ids(tok) == (frozenset({ids["open"]}), frozenset({ids["close"]}))
    forced = [ids["open"], ids["the"], ids["nl"], ids["yuki"], ids["nl2"], ids["close"],
              ids["nl2"], ids["nl"], ids["yuki"], ids["book"], ids["nl"], ids["the"]]
    res, steps = _decode(think_model, forced)
    # newlines inside the block and whitespace right after it never stop
    assert res.stopped_by == "newline"
    assert res.generated == forced[:11]
    assert res.response_start == 6
    assert res.text == "Yuki book"
    assert res.thinking == "the\n Yuki"
    assert [s.thinking for s in steps] == [True] * 6 + [False] * 5
    # the gold answer occurs inside the thinking too: only the response's counts
    assert answer_steps(tok, res.generated, "Yuki", start=res.response_start) == [8]
    assert answer_steps(tok, res.generated, "Yuki") == [8]  # found from </think>
    assert answer_steps(tok, res.generated, "Yuki", start=0) == [3]

    # thinking off: the markers are ordinary tokens, the first bare newline stops
    off, off_steps = _decode(think_model, forced, thinking=False)
    assert off.generated == forced[:3] and off.response_start == 0
    assert off.text == "<think> the"
    assert not any(s.thinking for s in off_steps)


def test_thinking_left_open_by_the_prompt_and_never_closed(think_model, ids):
    tok = think_model.tokenizer
    # the prompt ends inside a block (chat templates that open <think> themselves)
    forced = [ids["the"], ids["nl"], ids["close"], ids["yuki"], ids["nl"]]
    res = greedy_decode(think_model, PROMPT + [ids["open"]], forced_tokens=forced)
    assert res.generated == forced and res.stopped_by == "newline"
    assert res.response_start == 3 and res.text == "Yuki" and res.thinking == "the"
    assert response_start(tok, forced[:3], thinking_open=True) == 3

    # a block that never closes: no response, no answer step
    forced = [ids["open"], ids["yuki"], ids["nl"], ids["the"]]
    res = greedy_decode(think_model, PROMPT, forced_tokens=forced)
    assert res.stopped_by == "max_new_tokens" and res.generated == forced
    assert res.response_start == 4 and res.text == ""
    assert answer_steps(tok, res.generated, "Yuki", start=res.response_start) == []
    assert answer_steps(tok, res.generated, "Yuki") == []
    # EOS inside the block still stops
    res = greedy_decode(think_model, PROMPT, forced_tokens=[ids["open"], ids["eos"]])
    assert res.stopped_by == "eos" and res.text == "" and res.response_start == 2


def test_stop_rule_and_thinking_are_run_settings(tiny_dirs, qwen3, own_answer_trials,
                                                 tmp_path):
    """The CLI threads both options to ``score_trials``; ``meta.json`` records them and a
    run made under another stop rule is not resumed."""
    import json

    from typer.testing import CliRunner

    from locos_tl import save_trials, score_trials
    from locos_tl.cli import app
    from locos_tl.errors import LocosError

    runner = CliRunner()
    trials = save_trials(own_answer_trials[:1], tmp_path / "trials.jsonl")
    out = tmp_path / "run"
    args = ["score", "--model", str(tiny_dirs["qwen3"]), "--trials", str(trials),
            "--out", str(out), "--max-new-tokens", "8"]
    bad = runner.invoke(app, [*args, "--stop-rule", "newline"])
    assert bad.exit_code == 2 and "newline_token" in bad.output
    ok = runner.invoke(app, [*args, "--stop-rule", "contains_newline", "--no-thinking"])
    assert ok.exit_code == 0, ok.output
    meta = json.loads((out / "meta.json").read_text())
    settings = meta.get("settings", meta)
    assert settings["stop_rule"] == "contains_newline" and settings["thinking"] is False
    with pytest.raises(LocosError):
        score_trials(qwen3, own_answer_trials[:1], max_new_tokens=8, out_dir=out,
                     progress=False)
    score_trials(qwen3, own_answer_trials[:1], max_new_tokens=8, out_dir=tmp_path / "new",
                 progress=False)
    settings = json.loads((tmp_path / "new" / "meta.json").read_text())
    settings = settings.get("settings", settings)
    assert settings["stop_rule"] == "newline_token" and settings["thinking"] is True
