"""The token ids of a text as the tokenizer writes it right after a prompt.

A text encoded on its own is not always the token sequence that follows a prompt: a
SentencePiece-style tokenizer that marks the start of a text
(``Metaspace(prepend_scheme="first")``: Llama-2, Mistral, Phi-3, TinyLlama) encodes
``"Chiara"`` alone as ``▁Chiara``, but after ``"<|assistant|>\\n"`` as ``Chiara``.
:func:`continuation_token_ids` cuts the ids from the joint encoding of prompt and text
(lm-evaluation-harness's rule for continuations). Byte-level BPE (SmolLM2, Qwen,
Llama-3) and tokenizers with no start-of-text rule give the same ids either way.

Shared by the name margin (:mod:`locos_tl.experiments.margin`), the teacher-forced
sweep, the elicitation's training answer (:func:`locos_tl.organisms.elicit.answer_ids`)
and HeadKV's answer length (:func:`locos_tl.detectors.headkv.headkv_n_steps`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["answer_prefix", "continuation_token_ids", "encode_text", "trial_context"]


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """``text``'s ids with no special tokens added (no length warning: prompts may be
    long). ``tokenizer`` is a Hugging Face tokenizer, or any object with a
    ``__call__`` or an ``encode(text, add_special_tokens=False)``."""
    if not callable(tokenizer):
        return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    try:
        enc = tokenizer(text, add_special_tokens=False, verbose=False)
    except TypeError:  # a tokenizer-like object without ``verbose``
        enc = tokenizer(text, add_special_tokens=False)
    ids = enc["input_ids"] if isinstance(enc, Mapping) else enc.input_ids
    return [int(i) for i in ids]


def continuation_token_ids(tokenizer: Any, texts: Sequence[str], *,
                           context: str | None = None) -> list[list[int]]:
    """The ids of each of ``texts`` (no special tokens) as the tokenizer writes it right
    after ``context`` (the prompt text, encoded once).

    The rule (lm-evaluation-harness's for continuations): ``encode(context + text)``
    after its longest common prefix with ``encode(context)``.

    Boundary merge: where the joint encoding changes a token of the context's own
    encoding, the context's trailing whitespace is moved to the continuation (as
    lm-evaluation-harness does): the joint encoding is cut after the tokens of the
    stripped context. The whitespace's own tokens are the prompt's and are left out; a
    token that fuses the whitespace with the text's first characters (``"\\nA"`` of a
    SentencePiece vocabulary after ``"<|assistant|>\\n"``, ``▁Chiara`` after a prompt
    ending in a space) is replaced by the ids of those characters after the stripped
    context. So the prompt's ids followed by these decode to ``context + text``. Where
    that fails too (a context without trailing whitespace whose last token fuses with
    the text, as a word-level tokenizer reads ``"QYuki"`` as one unknown word; a
    tokenizer without character offsets), the text is encoded on its own.

    Args:
        tokenizer: a Hugging Face tokenizer (or a model's ``.tokenizer``); see
            :func:`encode_text`.
        texts: the continuations (names, answers), each with whatever precedes it at
            the answer position (a space after a completion template).
        context: the text the ids continue; None encodes each text on its own.

    Returns:
        one id list per text, in order (``[]`` for a text that tokenizes to nothing).
    """
    if not context:
        return [encode_text(tokenizer, t) for t in texts]
    context_ids = encode_text(tokenizer, context)
    out = []
    for text in texts:
        ids = _cut(context_ids, encode_text(tokenizer, context + text))
        if not ids:
            ids = _after_merge(tokenizer, context, text)
        out.append(ids or encode_text(tokenizer, text))
    return out


def answer_prefix(trial: Any) -> str:
    """What precedes a trial's answer at the answer position: a space after the
    completion template (``meta["template"] == "completion"``: ``"... The character's
    name is"``), nothing at the start of a chat turn."""
    return " " if (getattr(trial, "meta", None) or {}).get("template") == "completion" else ""


def trial_context(tokenizer: Any, trial: Any) -> str:
    """The text a trial's answer continues: its prompt text, or, for a trial built from
    ids (``prompt == ""``), its tokens decoded (special tokens kept)."""
    if trial.prompt:
        return str(trial.prompt)
    return str(tokenizer.decode(list(trial.tokens), skip_special_tokens=False))


def _cut(context_ids: Sequence[int], joint_ids: Sequence[int]) -> list[int]:
    """``joint_ids`` after ``context_ids`` when ``joint_ids`` starts with all of them,
    else ``[]`` (a boundary merge)."""
    n = len(context_ids)
    return list(joint_ids[n:]) if list(joint_ids[:n]) == list(context_ids) else []


def _after_merge(tokenizer: Any, context: str, text: str) -> list[int]:
    """The ids of ``text`` after ``context`` on a boundary merge, the whitespace moved
    (:func:`continuation_token_ids`); ``[]`` where that does not apply."""
    stripped = context.rstrip()
    if stripped == context or not getattr(tokenizer, "is_fast", False):
        return []
    enc = tokenizer(context + text, add_special_tokens=False, return_offsets_mapping=True,
                    verbose=False)
    stripped_ids = encode_text(tokenizer, stripped)
    rest = _cut(stripped_ids, [int(i) for i in enc["input_ids"]])
    if not rest:
        return []
    spans = [(int(a), int(b)) for a, b in enc["offset_mapping"]][len(stripped_ids):]
    end = len(context)
    first = next((i for i, (_, b) in enumerate(spans) if b > end), None)
    if first is None:  # the whitespace swallowed the text
        return []
    a, b = spans[first]
    if a >= end:  # the text's tokens start clean after the whitespace
        return rest[first:]
    head = _cut(stripped_ids, encode_text(tokenizer, stripped + (context + text)[end:b]))
    return [*head, *rest[first + 1:]] if head else []
