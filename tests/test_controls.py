"""Specificity controls of the dissociation score (arXiv 2607.01002, Sec. 4).

The control metric (exact match after lower-casing and stripping, as the authors'
release scores it) on hand-computed cases; the parametric / arithmetic / organism-echo
builders against independent recomputation; and ``locos ablate --control`` end to end on
the shipped organism, its DS(k) recomputed with plain PyTorch hooks on the HF model.
"""

from __future__ import annotations

import json
import operator
import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from locos_tl import Trial, save_trials
from locos_tl.cli import app
from locos_tl.data.controls import (
    arithmetic_examples,
    build_arithmetic_trials,
    build_control_trials,
    build_parametric_trials,
    parametric_examples,
)
from locos_tl.data.hub import ControlExample
from locos_tl.engine.answers import rougeL_f
from locos_tl.errors import DataFormatError
from locos_tl.experiments.dissociation import BASELINE, dissociation_score
from locos_tl.experiments.task_metrics import (
    answer_word_match,
    control_exact_match,
    first_token_match,
    nolima_contains,
    score_control,
)
from locos_tl.models.tiny import byte_bpe_tokenizer
from locos_tl.organisms import SMALL_ORGANISM, make_echo_trials, make_trials
from locos_tl.organisms import vocab as V

runner = CliRunner()


# -- the control metric ------------------------------------------------------------------
def test_control_exact_match_hand_cases() -> None:
    assert control_exact_match("17", ["7"]) == 0.0
    assert nolima_contains("17", ["7"]) == 1.0  # the former default counts it
    assert control_exact_match(" Paris ", ["paris"]) == 1.0
    assert nolima_contains(" Paris ", ["paris"]) == 0.0  # case-sensitive
    assert control_exact_match("Paris.", ["Paris"]) == 0.0  # exact: punctuation counts
    assert control_exact_match("\n7\n", ["7"]) == 1.0
    t = Trial((1, 2, 3), (1, 2), "William Shakespeare",
              meta={"answer_aliases": ["Shakespeare"]})
    assert score_control("shakespeare", t) == {"exact_match": 1.0, "contains": 0.0}
    assert score_control("Shakespeare wrote it", t) == {"exact_match": 0.0, "contains": 1.0}


def test_the_three_answer_in_response_tests_hand_cases() -> None:
    """contains (substring), word match (whole word), first token: where they differ."""
    cases = {  # response -> (contains, word match) for the answer "Yuki"
        "The character is Yuki.": (1.0, True),
        "Yukiko": (1.0, False),  # inside a longer word: a substring, no word
        "Yuki-san": (1.0, True),  # "-" is no word character
        "yuki": (0.0, False),  # both case-sensitive
        "  Yuki  ": (1.0, True),
        "": (0.0, False),
    }
    for response, (contains, word) in cases.items():
        assert nolima_contains(response, ["Yuki"]) == contains, response
        assert answer_word_match(response, "Yuki") is word, response
    assert answer_word_match("a+b = 3", " a+b ")  # the answer is stripped and escaped
    assert not answer_word_match("xa+b", "a+b")
    assert first_token_match(42, (42, 7)) and not first_token_match(5, (42, 7))
    assert not first_token_match(None, (42,))  # nothing generated


def test_dissociation_score_defaults_to_exact_match() -> None:
    def rows(metric: str, p0: float, p2: float) -> list[dict]:
        return [{"method": BASELINE, "k": 0, "seed": 0, "metric": metric, "value": p0,
                 "n_trials": 4},
                {"method": "locos", "k": 2, "seed": 0, "metric": metric, "value": p2,
                 "n_trials": 4}]

    ret = pd.DataFrame(rows("rougeL", 0.8, 0.2))
    ctl = pd.DataFrame(rows("exact_match", 0.5, 0.25) + rows("contains", 1.0, 1.0))
    ds = dissociation_score(ret, ctl).set_index(["method", "k"])
    assert ds.loc[("locos", 2), "P0"] == 0.5
    assert ds.loc[("locos", 2), "ds"] == pytest.approx(0.6 / 0.8 - 0.25 / 0.5)  # 0.25
    old = dissociation_score(ret, ctl, control_metric="contains").set_index(["method", "k"])
    assert old.loc[("locos", 2), "ds"] == pytest.approx(0.75)


# -- builders ------------------------------------------------------------------------------
def test_arithmetic_examples_are_correct_distinct_and_seeded() -> None:
    exs = arithmetic_examples(30, seed=7)
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    seen = set()
    for ex in exs:  # recompute every answer from the question text
        a, op, b = re.fullmatch(r"What is (\d) ([-+*]) (\d)\?", ex.question).groups()
        assert ex.answer == str(ops[op](int(a), int(b)))
        assert 1 <= int(a) <= 9 and 1 <= int(b) <= 9 and (op != "-" or int(a) >= int(b))
        assert ex.category == op and ex.meta == {"a": int(a), "op": op, "b": int(b)}
        seen.add(ex.question)
    assert len(seen) == 30
    assert sorted(ex.category for ex in exs).count("-") == 10  # even spread over 3 ops
    assert [e.question for e in arithmetic_examples(30, seed=7)] == [e.question for e in exs]
    assert [e.question for e in arithmetic_examples(30, seed=8)] != [e.question for e in exs]
    assert len(arithmetic_examples(45, ops=["-"])) == 45  # every a >= b cell
    with pytest.raises(ValueError, match="1..45"):
        arithmetic_examples(46, ops=["-"])
    with pytest.raises(ValueError, match="unknown operator"):
        arithmetic_examples(3, ops=["/"])


def test_control_trials_span_the_question() -> None:
    tok = byte_bpe_tokenizer()
    trials = build_arithmetic_trials(tok, n=6, seed=1)
    for t in trials:
        q = re.search(r"Question: (.*)\nAnswer:", t.prompt).group(1)
        assert t.prompt == f"Question: {q}\nAnswer:"
        assert list(t.tokens) == tok(t.prompt)["input_ids"]
        s, e = t.needle_span
        assert tok.decode(list(t.tokens[s:e])).strip() == q
        assert t.meta["control"] == "arithmetic"
    par = build_parametric_trials(tok)
    facts = json.loads((Path(__file__).resolve().parents[1] / "locos_tl" / "data"
                        / "controls.json").read_text())
    n_city, n_ent = len(facts["city_country"]["facts"]), len(facts["entity"])
    assert (n_city, n_ent) == (65, 30) and len(par) == n_city + n_ent
    lyon = next(t for t in par if t.meta.get("subject") == "Lyon")
    assert lyon.answer == "France" and "city of Lyon?" in lyon.prompt
    chicago = next(t for t in par if t.meta.get("subject") == "Chicago")
    assert score_control(" usa", chicago)["exact_match"] == 1.0  # alias
    ents = [t for t in par if t.meta["category"] == "entity"]
    assert {t.answer for t in ents} >= {"Leonardo da Vinci", "1945", "Au"}
    sub = build_parametric_trials(tok, n=5, kinds=["entity"], seed=3)
    assert len(sub) == 5 and {t.trial_id for t in sub} <= {t.trial_id for t in ents}
    assert len(parametric_examples(["city_country"])) == 65
    with pytest.raises(ValueError, match="unknown parametric kind"):
        parametric_examples(["sports"])


def test_control_trials_with_a_chat_template() -> None:
    tok = byte_bpe_tokenizer()
    tok.chat_template = ("{% for m in messages %}<u>{{ m['content'] }}</u>{% endfor %}"
                         "{% if add_generation_prompt %}<a>{% endif %}")
    (t,) = build_control_trials(tok, [ControlExample("What is 2 + 2?", "4")],
                                control="arithmetic", chat_template=True)
    assert t.prompt == "<u>Question: What is 2 + 2?\nAnswer:</u><a>"
    s, e = t.needle_span
    assert tok.decode(list(t.tokens[s:e])).strip() == "What is 2 + 2?"
    with pytest.raises(DataFormatError, match="no chat template"):
        build_control_trials(byte_bpe_tokenizer(), [ControlExample("q?", "a")], control="x",
                             chat_template=True)
    with pytest.raises(DataFormatError, match="question"):
        build_control_trials(tok, [ControlExample("q?", "a")], control="x", template="Q:")


# -- the organism ----------------------------------------------------------------------------
def _hf_organism(heads: list[tuple[int, int]]):
    """The organism as a plain HF model; ``heads`` zeroed at the ``o_proj`` input."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(SMALL_ORGANISM).eval()
    d = m.config.head_dim

    def hook(layer: int):
        def pre(_mod, args):
            x = args[0].clone()
            for l, h in heads:
                if l == layer:
                    x[..., h * d:(h + 1) * d] = 0
            return (x,)
        return pre

    for i, layer in enumerate(m.model.layers):
        layer.self_attn.o_proj.register_forward_pre_hook(hook(i))
    return m


def _hf_greedy(m, ids: tuple[int, ...], n: int) -> str:
    eos = V.token_to_id()[V.EOS]
    seq, out = list(ids), []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(m(torch.tensor([seq])).logits[0, -1].argmax())
            if nxt == eos:
                break
            out.append(V.vocab_list()[nxt])
            seq.append(nxt)
    return " ".join(out)


def test_organism_answers_the_echo_control_without_context() -> None:
    trials = make_echo_trials(16, seed=0)
    bos = V.token_to_id()[V.BOS]
    for t in trials:
        assert t.tokens == (bos, V.token_to_id()[t.answer]) and t.needle_span == (1, 2)
    m = _hf_organism([])
    acc = sum(_hf_greedy(m, t.tokens, 1) == t.answer for t in trials) / len(trials)
    assert acc == 1.0  # measured: every one of the 100 most frequent words is echoed


# measured on the shipped retrieval-2l (8 non-literal trials, seed 101; 16 echo words of
# the 200 most frequent, seed 0): zeroing L1H0, L1H1 breaks 3 echoes ("some", "really",
# "am"), so P(2) = 13/16 and DS(2) = (1 - 0) / 1 - (1 - 13/16) / 1 = 0.8125
MEASURED_P0, MEASURED_PK, MEASURED_DS = 1.0, 13 / 16, 0.8125


def test_ablate_with_control_gives_ds_on_the_organism(tmp_path) -> None:
    gt = json.loads((Path(SMALL_ORGANISM) / "ground_truth.json").read_text())
    writers = [tuple(h) for h in gt["nonliteral_writer"]]
    assert writers == [(1, 0), (1, 1)]
    retrieval = make_trials("nonliteral", 8, 64, seed=101)
    control = make_echo_trials(16, seed=0, top=200)
    save_trials(retrieval, tmp_path / "nl.jsonl")
    res = runner.invoke(app, ["build-trials", "organism-echo", "--out",
                              str(tmp_path / "echo.jsonl"), "--num-examples", "16",
                              "--top", "200", "--seed", "0"])
    assert res.exit_code == 0, res.output
    out = tmp_path / "run"
    spec = ",".join(f"L{l}H{h}" for l, h in writers)
    res = runner.invoke(app, [
        "ablate", "--model", SMALL_ORGANISM, "--heads", f"writers={spec}",
        "--trials", str(tmp_path / "nl.jsonl"), "--control", str(tmp_path / "echo.jsonl"),
        "--control-max-new-tokens", "1", "--out", str(out), "--k", "2", "--no-random",
        "--bottom", "none", "--mode", "output_zero", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    ds = pd.read_csv(out / "dissociation.csv")
    assert list(ds["method"]) == ["writers"] and list(ds["k"]) == [2]
    meta = json.loads((out / "meta.json").read_text())["dissociation"]
    assert meta["control_metric"] == "exact_match" and meta["retrieval_metric"] == "rougeL"
    assert (out / "control" / "evaluation.csv").exists()

    # independent: plain HF forward, heads zeroed at the o_proj input, greedy decoding
    base, abl = _hf_organism([]), _hf_organism(writers)
    r0 = sum(rougeL_f(_hf_greedy(base, t.tokens, 2), t.answer) for t in retrieval) / 8
    rk = sum(rougeL_f(_hf_greedy(abl, t.tokens, 2), t.answer) for t in retrieval) / 8
    p0 = sum(_hf_greedy(base, t.tokens, 1).lower() == t.answer.lower() for t in control) / 16
    pk = sum(_hf_greedy(abl, t.tokens, 1).lower() == t.answer.lower() for t in control) / 16
    row = ds.iloc[0]
    assert (row.R0, row.R, row.P0, row.P) == pytest.approx((r0, rk, p0, pk), abs=1e-9)
    assert row.ds == pytest.approx((r0 - rk) / r0 - (p0 - pk) / p0, abs=1e-9)
    assert meta["rows"][0]["ds"] == pytest.approx(row.ds)
    # measured on the shipped organism: non-literal retrieval collapses, the echo survives
    assert (r0, rk, p0, pk) == pytest.approx((1.0, 0.0, MEASURED_P0, MEASURED_PK), abs=1e-9)
    assert row.ds == pytest.approx(MEASURED_DS, abs=0.02) and row.ds > 0.5

