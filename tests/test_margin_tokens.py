"""The name margin scores the tokens the model writes after the prompt.

A SentencePiece-style tokenizer (``Metaspace(prepend_scheme="first")``: Llama-2,
Mistral, Phi-3, TinyLlama) marks the start of a text: ``"Chiara"`` alone is
``▁Chiara``, but after ``"<|assistant|>\\n"`` it is ``Chiara``. The names' ids are cut
from the joint encoding of prompt and name (lm-evaluation-harness's rule), and every
caller (``name_margin``, ``ablation_sweep``, ``teacher_forced_sweep``, the elicitation's
training answer, HeadKV's answer length) uses them.
Byte-level BPE (SmolLM2), Gemma-style ``▁`` without a start rule and the organisms'
word-level tokenizer keep the ids they had (published margins do not change).
"""

from __future__ import annotations

import dataclasses

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from locos_tl import Trial
from locos_tl.experiments.margin import (
    candidate_token_ids,
    margin_of_logprobs,
    name_logprobs,
    name_margin,
    name_token_ids,
)
from locos_tl.experiments.teacher_forced import answer_token_ids

NAMES = ["Chiara", "Yuki", "Stuart", "Mandla"]
SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>"]
# Phi-3-like: each turn is "<|role|>\n{content}<|end|>\n"
PHI3_CHAT = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
             "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
CORPUS = ("Chiara lives next to the Semper Opera House in Dresden. Yuki has been to the "
          "Harbour Bridge.\nStuart saw the Sky Tower.\nMandla went to Cape Town. Who has "
          "been to Dresden? The character's name is Chiara. Which character? Yuki\n"
          "Answer with the name only.\n") * 20


def _sentencepiece_like(prepend_scheme: str) -> PreTrainedTokenizerFast:
    """A small BPE over ``▁``-marked words (Llama-2 / Phi-3 style with ``"first"``,
    Gemma style with ``"never"``) and a Phi-3-like chat template."""
    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    tk.train_from_iterator([CORPUS], trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                 unk_token="<unk>", pad_token="<unk>",
                                 additional_special_tokens=SPECIALS[3:])
    hf.chat_template = PHI3_CHAT
    return hf


@pytest.fixture(scope="module")
def llama2_tok() -> PreTrainedTokenizerFast:
    return _sentencepiece_like("first")


def _ids(tok, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False).input_ids)


def _chat_prompt(tok, question: str = "Who has been to Dresden?") -> str:
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                   add_generation_prompt=True)


def _trial(tok, prompt: str, template: str = "default", bos: bool = True) -> Trial:
    tokens = ([tok.bos_token_id] if bos else []) + _ids(tok, prompt)
    return Trial(tokens=tokens, needle_span=(1, 3), answer=NAMES[0], prompt=prompt,
                 meta={"character": NAMES[0], "distractor_names": NAMES[1:],
                       "template": template})


def _written_reply(tok, question: str, reply: str) -> list[int]:
    """The ids of ``reply`` in the tokenization of the whole conversation (what a chat
    model is trained to write after the prompt)."""
    prompt = _ids(tok, _chat_prompt(tok, question))
    whole = _ids(tok, tok.apply_chat_template(
        [{"role": "user", "content": question}, {"role": "assistant", "content": reply}],
        tokenize=False))
    assert whole[: len(prompt)] == prompt
    end = whole.index(tok.convert_tokens_to_ids("<|end|>"), len(prompt))
    return whole[len(prompt):end]


def test_a_word_start_marker_tokenizer_scores_the_names_the_model_writes(llama2_tok):
    tok = llama2_tok
    t = _trial(tok, _chat_prompt(tok))
    assert t.prompt.endswith("<|assistant|>\n")
    written = [_written_reply(tok, "Who has been to Dresden?", n) for n in NAMES]
    old = [name_token_ids(tok, n) for n in NAMES]  # each name encoded on its own
    # the bug: on its own the name starts with the word-start marker; the model writes it
    # without one after "<|assistant|>\n"
    assert tok.convert_ids_to_tokens(old[0])[0].startswith("▁")
    assert not tok.convert_ids_to_tokens(written[0])[0].startswith("▁")
    assert all(o != w for o, w in zip(old, written, strict=True))
    assert candidate_token_ids(tok, t) == written
    assert answer_token_ids(tok, t) == written  # teacher_forced_sweep's names
    # a trial built from ids (no prompt text) reads its context from its tokens
    assert candidate_token_ids(tok, dataclasses.replace(t, prompt="")) == written
    # name_token_ids itself, given the context
    ctx = _ids(tok, t.prompt)
    for n, w in zip(NAMES, written, strict=True):
        assert name_token_ids(tok, n, context=t.prompt) == w
        assert _ids(tok, t.prompt + n) == ctx + w


def test_the_completion_template_keeps_the_space_marker(llama2_tok):
    """After ``"... name is"`` the answer starts with a space: ``▁Chiara`` both ways."""
    tok = llama2_tok
    prompt = "Chiara lives in Dresden. Who has been to Dresden? The character's name is"
    t = _trial(tok, prompt, template="completion")
    got = candidate_token_ids(tok, t)
    assert got == [_ids(tok, prompt + " " + n)[len(_ids(tok, prompt)):] for n in NAMES]
    assert got == [name_token_ids(tok, n, " ") for n in NAMES]
    assert tok.convert_ids_to_tokens(got[0])[0] == "▁Chiara"


@pytest.mark.parametrize("ending, name, written", [
    ("chat", "Arjun", ["A", "r", "<unk>", "u", "n"]),  # "\nA" is a token of this vocabulary
    ("chat", "Anna", ["A", "n", "n", "a"]),
    ("space", "Chiara", ["Chiara"]),  # the prompt's "▁" would fuse into "▁Chiara"
])
def test_a_boundary_merge_moves_the_whitespace(llama2_tok, ending, name, written):
    """A prompt whose trailing whitespace fuses with the name's first characters: the
    prompt's own ids are no prefix of the joint encoding. The whitespace moves to the
    continuation (lm-evaluation-harness): the name's ids follow the prompt's whitespace
    token without a word-start marker (the name on its own has one), the joint
    encoding's tokens after the fused one are kept, and prompt + name decode to the
    prompt text and the name."""
    tok = llama2_tok
    prompt = (_chat_prompt(tok) if ending == "chat"
              else "Who has been to Dresden? The character's name is ")
    ctx, joint = _ids(tok, prompt), _ids(tok, prompt + name)
    assert joint[: len(ctx)] != ctx  # the merge
    alone = name_token_ids(tok, name)
    assert tok.convert_ids_to_tokens(alone)[0].startswith("▁")  # what was scored before
    got = name_token_ids(tok, name, context=prompt)
    assert tok.convert_ids_to_tokens(got) == written
    assert got[1:] == joint[len(ctx):]
    assert tok.decode(ctx + got) == tok.decode(joint)
    t = dataclasses.replace(_trial(tok, prompt), meta={
        "character": name, "distractor_names": NAMES, "template": "default"})
    assert candidate_token_ids(tok, t)[0] == answer_token_ids(tok, t)[0] == got


def test_a_merge_without_whitespace_encodes_the_name_on_its_own(llama2_tok):
    """No whitespace to move (the prompt's last token ``▁C`` fuses with ``"hiara"`` into
    ``▁Chiara``): the name is encoded on its own."""
    tok = llama2_tok
    prompt = "Who has been to Dresden? The character's name is C"
    ctx, joint = _ids(tok, prompt), _ids(tok, prompt + "hiara")
    assert joint[: len(ctx)] != ctx
    assert name_token_ids(tok, "hiara", context=prompt) == name_token_ids(tok, "hiara")


# -- the tokenizers that work today keep their ids --------------------------------------

def _bytelevel_chat() -> PreTrainedTokenizerFast:
    """SmolLM2-style: byte-level BPE with ChatML turns."""
    from locos_tl.models.tiny import byte_bpe_tokenizer

    tok = byte_bpe_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                         "{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


@pytest.mark.parametrize("kind", ["bytelevel", "gemma_like"])
def test_tokenizers_without_a_start_rule_keep_their_ids(kind):
    tok = _bytelevel_chat() if kind == "bytelevel" else _sentencepiece_like("never")
    names = [*NAMES, "Zoë Ngata", "Jean-Luc", "O'Brien", "R2D2"]
    chat = _chat_prompt(tok)
    plain = "Chiara lives in Dresden.\n\nQuestion: Who has been to Dresden?\nAnswer:"
    completion = "Who has been to Dresden? The character's name is"
    for prompt, template in ((chat, "default"), (plain, "default"),
                             (completion, "completion"), (chat, "completion")):
        t = dataclasses.replace(_trial(tok, prompt, template, bos=False), meta={
            "character": names[0], "distractor_names": names[1:], "template": template})
        before = [name_token_ids(tok, n, " " if template == "completion" else "")
                  for n in names]
        assert candidate_token_ids(tok, t) == before
        assert answer_token_ids(tok, t) == before
        assert candidate_token_ids(tok, dataclasses.replace(t, prompt="")) == before


def test_the_organisms_word_level_answers_keep_their_ids():
    from locos_tl.organisms import make_trials
    from locos_tl.organisms.vocab import build_tokenizer

    tok = build_tokenizer()
    trials = make_trials("nonliteral", 4, n_tokens=64, seed=0)
    for t in trials:
        want = [[tok.convert_tokens_to_ids(t.answer)]]
        assert answer_token_ids(tok, t) == want
        assert answer_token_ids(tok, dataclasses.replace(t, prompt="")) == want


# -- every caller scores the written ids -----------------------------------------------

#: (name, its ids on their own, its ids after "<|assistant|>\n"): the same count for
#: ``Chiara``, 5 tokens (``▁ A n n a``) where the model writes 4 for ``Anna``
WRITTEN_COUNTS = (("Chiara", 1, 1), ("Anna", 5, 4))


def test_the_elicitation_trains_on_the_written_answer(llama2_tok):
    """The elicitation's training answer is the joint encoding's continuation, not the
    answer encoded on its own."""
    from locos_tl.organisms.elicit import answer_ids

    tok = llama2_tok
    prompt = _chat_prompt(tok)
    for name, n_alone, n_written in WRITTEN_COUNTS:
        t = dataclasses.replace(_trial(tok, prompt), answer=name)
        written = name_token_ids(tok, name, context=prompt)
        alone = _ids(tok, name)
        assert written != alone and (len(alone), len(written)) == (n_alone, n_written)
        assert answer_ids(tok, t) == [*written, tok.eos_token_id]
        assert answer_ids(tok, dataclasses.replace(t, prompt="")) == [*written,
                                                                      tok.eos_token_id]


def test_headkv_counts_the_written_answer(llama2_tok):
    """HeadKV decodes as many steps as the answer has tokens where the model writes it:
    after the prompt and a thinking block (the context a run hands it)."""
    from locos_tl.detectors import HeadKV, TrialOutcome
    from locos_tl.detectors.headkv import headkv_n_steps
    from locos_tl.engine.stops import DecodeResult
    from locos_tl.runs.trial import response_context

    tok = llama2_tok
    prompt = _chat_prompt(tok)
    think = _ids(tok, "Harbour Bridge.")
    for name, n_alone, n_written in WRITTEN_COUNTS:
        t = dataclasses.replace(_trial(tok, prompt), answer=name)
        written = name_token_ids(tok, name, context=prompt)
        assert headkv_n_steps(tok, name) == n_alone  # the released code's count
        assert headkv_n_steps(tok, name, context=prompt) == n_written
        result = DecodeResult(prompt_len=len(t.tokens), generated=[*think, *written, 2],
                              text=name, stopped_by="eos", response_start=len(think))
        context = response_context(tok, t, result)
        assert context == prompt + tok.decode(think, skip_special_tokens=False)
        outcome = TrialOutcome(generated=result.generated, response=name, answer=name,
                               rouge1_recall=1.0, answer_steps=[], gate_threshold=0.5,
                               tokenizer=tok, response_start=len(think), context=context)
        assert HeadKV().used_steps(outcome) == list(range(len(think),
                                                          len(think) + n_written))
        assert HeadKV().response_prefix(outcome) == name
    # after a completion template the answer starts with a space: ``▁Anna``, as alone
    completion = "Who has been to Dresden? The character's name is"
    assert headkv_n_steps(tok, "Anna", context=completion, prefix=" ") == \
        len(_ids(tok, completion + " Anna")) - len(_ids(tok, completion)) == 5


@pytest.fixture(scope="module")
def llama2_model(llama2_tok, tmp_path_factory):
    """A tiny random Llama whose tokenizer marks the start of a text."""
    from locos_tl import load_model
    from locos_tl.models.tiny import make_tiny_checkpoint

    d = make_tiny_checkpoint("llama", tmp_path_factory.mktemp("llama2") / "m", seed=5,
                             tokenizer=llama2_tok)
    return load_model(d, device="cpu")


def test_the_sweeps_record_the_margin_of_the_written_names(llama2_model, llama2_tok):
    import locos_tl as lt

    model, tok = llama2_model, llama2_tok
    t = _trial(tok, _chat_prompt(tok))
    written = [_written_reply(tok, "Who has been to Dresden?", n) for n in NAMES]
    want = margin_of_logprobs(t, name_logprobs(model, t.tokens, written))
    alone = margin_of_logprobs(t, name_logprobs(model, t.tokens,
                                                [name_token_ids(tok, n) for n in NAMES]))
    # the two tokenizations score differently on this model (what the fix changes)
    assert abs(want["logp_target"] - alone["logp_target"]) > 1e-2
    assert name_margin(model, t)["logp_target"] == pytest.approx(want["logp_target"],
                                                                    abs=1e-4)

    kw = dict(k=[1], mode="query_zero", random=False, bottom=None, progress=False)
    tf = lt.teacher_forced_sweep(model, [t], {}, **kw).set_index("metric")["value"]
    dec = lt.ablation_sweep(model, [t], {}, max_new_tokens=2, name_margin=True, **kw)
    dec = dec.set_index("metric")["value"]
    # a batched forward against a prefilled cache: float32 summation order only
    assert tf["logp_answer"] == pytest.approx(want["logp_target"], abs=1e-4)
    assert tf["name_margin"] == pytest.approx(want["name_margin"], abs=1e-4)
    assert dec["name_margin"] == pytest.approx(want["name_margin"], abs=1e-4)
