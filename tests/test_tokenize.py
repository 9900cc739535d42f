"""One tokenization rule (locos_tl.tokenize): the checkpoint's own tokenizer, BOS exactly
once and only at position 0, on every path (builders, Trial.from_text, load_trials,
calibration, patching, the organism).

Three tiny Llama checkpoints (the Llama adapter has ``default_prepend_bos=True``, the
worst case) with byte-level tokenizers:

- ``bos``: a Llama-style post-processor prepends ``<s>``; its chat template writes
  ``{{ bos_token }}`` itself;
- ``nobos``: Qwen-style, no BOS token at all;
- ``bos_unused``: ``<s>`` is the BOS token but the tokenizer does not prepend it (the
  bridge's reloaded tokenizer does: the case that put needles one position apart).

The reference is always the checkpoint's own tokenizer,
``AutoTokenizer.from_pretrained(dir)``.
"""

from __future__ import annotations

import json

import pytest
import torch

TEMPLATE_BOS = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
TEMPLATE_PLAIN = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
KINDS = ("bos", "nobos", "bos_unused")
BOOK = (
    "The harbour was quiet in the early morning. Fishing boats rocked against the pier "
    "while gulls circled above the market. An old man sold bread and apples from a cart. "
    "Children walked to school along the river and the baker opened his shop. "
    "In the evening the lamps were lit one by one along the long stone bridge. "
    "Rain came in from the sea and the streets emptied quickly. "
) * 4
NEEDLE_SET = [{
    "id": "0101", "reasoning_type": "world_knowledge", "system_prompt": "Be brief.",
    "needle": "Actually, {CHAR} lives next to {1}.",
    "questions": {"onehop": "Which character has been to {2}?"},
    "character_set": ["Yuki"],
    "tests": {"T01": {"input_args": ["the Semper Opera House", "Dresden"]}},
}]


def _tokenizer(kind: str):
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    from locos_tl.models.tiny import byte_bpe_tokenizer

    base = byte_bpe_tokenizer()
    if kind == "nobos":
        base.chat_template = TEMPLATE_PLAIN
        return base
    tk = Tokenizer.from_str(base.backend_tokenizer.to_str())
    tk.add_special_tokens(["<s>"])
    if kind == "bos":
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tk.token_to_id("<s>"))]
        )
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>",
                                 eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.chat_template = TEMPLATE_BOS if kind == "bos" else TEMPLATE_PLAIN
    return hf


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """kind -> (checkpoint dir, bridge, the checkpoint's own tokenizer)."""
    from transformers import AutoTokenizer

    from locos_tl import load_model
    from locos_tl.models.tiny import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("bos")
    out = {}
    for kind in KINDS:
        d = make_tiny_checkpoint("llama", root / kind, seed=3, tokenizer=_tokenizer(kind))
        out[kind] = (d, load_model(d, device="cpu"),
                     AutoTokenizer.from_pretrained(d, local_files_only=True))
    return out


@pytest.fixture(scope="module")
def book_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("book") / "harbour.txt"
    p.write_text(BOOK, encoding="utf-8")
    return p


def _expected(own, text):
    """The checkpoint's own ids, with a text-written BOS not doubled."""
    ids = own(text)["input_ids"]
    if own.bos_token and text.startswith(own.bos_token) and ids[:2] == [own.bos_token_id] * 2:
        ids = ids[1:]
    return ids


def _bos_ok(kind, own, ids):
    """BOS once at position 0 (kind ``bos``) or nowhere (the other kinds)."""
    if kind == "bos":
        assert ids[0] == own.bos_token_id and ids.count(own.bos_token_id) == 1
    elif own.bos_token_id is not None:
        assert own.bos_token_id not in ids


@pytest.mark.parametrize("kind", KINDS)
def test_encode_prompt_is_the_checkpoint_tokenizer(ckpts, kind):
    from locos_tl.tokenize import bos_id, checkpoint_tokenizer, encode_prompt

    d, model, own = ckpts[kind]
    text = "Actually, Yuki lives next to the Semper Opera House."
    raw_bridge = model.tokenizer(text)["input_ids"]
    if kind == "bos_unused":  # the premise: the bridge's tokenizer adds a BOS the
        assert raw_bridge[0] == own.bos_token_id  # checkpoint's does not
        assert own(text)["input_ids"][0] != own.bos_token_id
    for tok in (model, model.tokenizer, own):
        ids, offsets = encode_prompt(tok, text)
        assert ids == own(text)["input_ids"]
        _bos_ok(kind, own, ids)
        assert len(offsets) == len(ids)
        for i, (a, b) in zip(ids, offsets, strict=True):  # offsets cover the text
            if (a, b) != (0, 0):
                assert own.decode([i]) == text[a:b]
    assert checkpoint_tokenizer(model)(text)["input_ids"] == own(text)["input_ids"]
    assert bos_id(model) == (own.bos_token_id if kind == "bos" else None)
    # "none" never adds one
    assert encode_prompt(model, text, bos="none")[0] == own(text, add_special_tokens=False)[
        "input_ids"]


def test_bos_written_by_text_is_not_doubled_and_never_elsewhere(ckpts):
    from locos_tl.errors import TrialError
    from locos_tl.tokenize import encode_prompt

    _, model, own = ckpts["bos"]
    bos = own.bos_token_id
    ids, offs = encode_prompt(model, "<s>Hello there")
    assert ids == own("<s>Hello there", add_special_tokens=False)["input_ids"]
    assert ids[0] == bos and ids.count(bos) == 1 and offs[0] == (0, 3)
    assert own("<s>Hello there")["input_ids"][:2] == [bos, bos]  # what HF alone gives
    with pytest.raises(TrialError, match="BOS may only be at position 0"):
        encode_prompt(model, "Hello<s> there")
    # A checkpoint without BOS: the same strings are plain text, kept as they are.
    _, model2, own2 = ckpts["nobos"]
    assert encode_prompt(model2, "Hello<s> there")[0] == own2("Hello<s> there")["input_ids"]


@pytest.mark.parametrize("kind", KINDS)
def test_chat_rendered_text_from_text_and_load_trials(ckpts, kind, tmp_path):
    from locos_tl import Trial, load_trials

    _, model, own = ckpts[kind]
    needle = "Actually, Yuki lives next to the Semper Opera House."
    user = f"Story: The harbour was quiet. {needle} Rain came.\nWho lives there?"
    prompt = own.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.startswith("<s>") == (kind == "bos")
    t_bridge = Trial.from_text(model.tokenizer, prompt, needle, "Yuki")
    t_own = Trial.from_text(own, prompt, needle, "Yuki")
    assert t_bridge.tokens == t_own.tokens and t_bridge.needle_span == t_own.needle_span
    assert list(t_bridge.tokens) == _expected(own, prompt)
    _bos_ok(kind, own, list(t_bridge.tokens))
    s, e = t_bridge.needle_span
    assert own.decode(list(t_bridge.tokens[s:e])).strip() == needle
    # a plain (template-free) prompt: BOS added iff the checkpoint adds it
    t_plain = Trial.from_text(model, user, needle, "Yuki")
    assert list(t_plain.tokens) == own(user)["input_ids"]
    _bos_ok(kind, own, list(t_plain.tokens))
    # text records in load_trials go through the same rule
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p, "needle": needle, "answer": "Yuki"})
                              for p in (prompt, user)) + "\n")
    a, b = load_trials(path, model.tokenizer)
    assert a.tokens == t_own.tokens and a.needle_span == t_own.needle_span
    assert b.tokens == t_plain.tokens


def test_load_trials_rejects_a_bos_inside_token_records(ckpts, tmp_path):
    from locos_tl import load_trials
    from locos_tl.errors import TrialError

    _, model, own = ckpts["bos"]
    bos = own.bos_token_id
    ids = own("Yuki lives next to the opera house.")["input_ids"]
    path = tmp_path / "t.jsonl"
    rec = {"tokens": ids + [bos] + ids[1:], "needle_span": [1, 4], "answer": "Yuki"}
    path.write_text(json.dumps(rec) + "\n")
    assert load_trials(path)[0].tokens.count(bos) == 2  # without a tokenizer: not checked
    with pytest.raises(TrialError, match=f"position {len(ids)}"):
        load_trials(path, model.tokenizer)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chat", [False, True])
def test_builder_with_tokenizer_dir_matches_from_text_on_the_bridge(
    ckpts, kind, chat, book_file, tmp_path
):
    from typer.testing import CliRunner

    from locos_tl import Trial, load_trials
    from locos_tl.cli import app

    d, model, own = ckpts[kind]
    ns = tmp_path / "needle_set.json"
    ns.write_text(json.dumps(NEEDLE_SET))
    out = tmp_path / "trials.jsonl"
    args = ["build-trials", "nolima", "--needle-set", str(ns), "--haystack", str(book_file),
            "--tokenizer", str(d), "--lengths", "400,480", "--depths", "0,50,100",
            "--out", str(out), "--chat-template" if chat else "--no-chat-template"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    trials = load_trials(out)
    assert len(trials) == 6
    for t in trials:
        assert len(t.tokens) == t.meta["length"]
        assert list(t.tokens) == _expected(own, t.prompt)
        _bos_ok(kind, own, list(t.tokens))
        again = Trial.from_text(model.tokenizer, t.prompt, t.meta["needle"], t.answer)
        assert again.tokens == t.tokens and again.needle_span == t.needle_span


@pytest.mark.parametrize("kind", KINDS)
def test_niah_builder_bridge_and_dir_agree(ckpts, kind, book_file):
    from locos_tl.data import build_niah_trials, load_haystacks
    from locos_tl.data.niah import parse_niah_probe

    _, model, own = ckpts[kind]
    probe = parse_niah_probe({"needle": "The key is under the third blue stone.",
                              "question": "Where is the key?",
                              "real_needle": "under the third blue stone"})
    hays = load_haystacks([book_file])
    kw = dict(lengths=[260], depths=[0, 60], chat_template=(kind == "bos"))
    a = build_niah_trials(model, [probe], hays, **kw)
    b = build_niah_trials(own, [probe], hays, **kw)
    assert [(t.tokens, t.needle_span) for t in a] == [(t.tokens, t.needle_span) for t in b]
    for t in a:
        assert len(t.tokens) == 260 and list(t.tokens) == _expected(own, t.prompt)
        _bos_ok(kind, own, list(t.tokens))


def test_calibration_follows_the_release_and_the_rule_on_request(ckpts):
    from locos_tl import calibrate_means

    _, model, own = ckpts["bos"]
    text = "The harbour was quiet in the early morning. Gulls circled above the market."
    raw = own(text, add_special_tokens=False)["input_ids"]
    default = calibrate_means(model, [text])  # release protocol: raw text, no BOS
    by_ids = calibrate_means(model, [raw])
    assert default.n_tokens == len(raw) and default.meta["bos"] == "none"
    torch.testing.assert_close(default.q, by_ids.q, rtol=0, atol=0)
    torch.testing.assert_close(default.z, by_ids.z, rtol=0, atol=0)
    ruled = calibrate_means(model, [text], bos="checkpoint")
    with_bos = calibrate_means(model, [own(text)["input_ids"]])
    assert ruled.n_tokens == len(raw) + 1
    torch.testing.assert_close(ruled.z, with_bos.z, rtol=0, atol=0)
    assert (ruled.z - default.z).abs().max() > 1e-4  # the BOS position does count


def test_corrupted_prompt_keeps_bos_at_zero_only(ckpts):
    from locos_tl import Trial
    from locos_tl.errors import TrialError
    from locos_tl.experiments.patching import corrupt_tokens

    _, model, own = ckpts["bos"]
    bos = own.bos_token_id
    needle = "Actually, Yuki lives next to the Semper Opera House."
    t = Trial.from_text(model, f"Story. {needle} Who?", needle, "Yuki")
    s, e = t.needle_span
    filler = "The grass is green. "
    c = corrupt_tokens(model.tokenizer, t, "filler", filler=filler)
    fill = own(filler, add_special_tokens=False)["input_ids"]
    assert c[:s] == list(t.tokens[:s]) and c[e:] == list(t.tokens[e:])
    assert c[s:e] == [fill[i % len(fill)] for i in range(e - s)]
    assert c[0] == bos and c.count(bos) == 1
    swapped = corrupt_tokens(model.tokenizer, t, "name_swap", swap_names=["Gary", "fox", "book"])
    assert swapped[0] == bos and swapped.count(bos) == 1 and len(swapped) == len(t.tokens)
    yuki, book = (own(w, add_special_tokens=False)["input_ids"] for w in (" Yuki", " book"))
    assert len(yuki) == len(book) == 1 and yuki[0] in t.tokens[s:e]
    assert swapped == [book[0] if x == yuki[0] and s <= i < e else x
                       for i, x in enumerate(t.tokens)]
    with pytest.raises(TrialError, match="filler holds the BOS"):
        corrupt_tokens(model.tokenizer, t, "filler", filler=[fill[0], bos])


def test_organism_trials_follow_the_rule():
    from pathlib import Path

    from transformers import AutoTokenizer

    from locos_tl import Trial
    from locos_tl.organisms.tasks import make_trials
    from locos_tl.tokenize import bos_id, encode_prompt

    d = Path(__file__).resolve().parents[1] / "data" / "organisms" / "retrieval-2l"
    own = AutoTokenizer.from_pretrained(d, local_files_only=True)
    assert bos_id(own) == own.bos_token_id is not None
    for task in ("literal", "nonliteral"):
        for t in make_trials(task, 4, 48, seed=1):
            assert list(t.tokens) == encode_prompt(own, t.prompt)[0] == own(t.prompt)["input_ids"]
            s, e = t.needle_span
            needle = own.decode(list(t.tokens[s:e]))
            again = Trial.from_text(own, t.prompt, needle, t.answer)
            if t.prompt.count(needle) == 1:
                assert again.needle_span == t.needle_span


@pytest.mark.parametrize("template", ["plain", "bos"])
def test_control_trials_with_a_chat_template_follow_the_rule(template):
    """Control trials (locos build-trials parametric|arithmetic --chat-template) go
    through the same rule as NoLiMa/NIAH prompts: a checkpoint that prepends BOS gets it
    exactly once at position 0, whether or not its chat template writes it."""
    from locos_tl.data.controls import ControlExample, build_control_trials

    tok = _tokenizer("bos")
    tok.chat_template = TEMPLATE_PLAIN if template == "plain" else TEMPLATE_BOS
    (t,) = build_control_trials(tok, [ControlExample("What is 2 + 2?", "4")],
                                control="arithmetic", chat_template=True)
    assert list(t.tokens) == _expected(tok, t.prompt)
    _bos_ok("bos", tok, list(t.tokens))
