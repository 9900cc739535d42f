"""One tokenization rule for every prompt locos_tl builds or reads.

The rule: a prompt text becomes the ids the **checkpoint's own tokenizer** gives
(``AutoTokenizer.from_pretrained(dir)(text)["input_ids"]``, i.e. Hugging Face
``add_special_tokens=True``), with the beginning-of-sequence token **exactly once and
only at position 0**:

- the BOS is prepended when, and only when, the checkpoint's tokenizer prepends one
  (Llama, Gemma: yes; Qwen: no);
- text that already starts with the BOS string (a chat template that writes
  ``{{ bos_token }}``) gets no second one;
- a BOS anywhere else in the text is an error (for checkpoints that use a BOS);
- an end-of-sequence token the tokenizer would append (OLMo-1-style post-processors)
  is not kept: a prompt is continued, not terminated (TransformerLens ``to_tokens``
  drops it too).

Why a rule of its own: a TransformerLens 4 ``TransformerBridge`` reloads the tokenizer
with ``add_bos_token=True`` and sets ``bos_token = eos_token`` where there is none, so
``model.tokenizer(text)`` can start with a BOS the checkpoint's tokenizer does not
write, and ``model.to_tokens`` follows ``cfg.default_prepend_bos`` (True for Llama-
style adapters even when the tokenizer adds no BOS). Trials built from the bridge's
tokenizer and from ``locos build-trials --tokenizer DIR`` would then put the same
needle one position apart. :func:`checkpoint_tokenizer` undoes the bridge's change and
:func:`encode_prompt` applies the rule; ``Trial.from_text``, ``load_trials`` (text
records), the NoLiMa/NIAH builders (``PromptBuilder``), ``calibrate_means`` and
``corrupt_tokens`` all go through it.

Token ids mean something only with the tokenizer that made them.
:func:`tokenizer_fingerprint` hashes a tokenizer's vocabulary and special tokens; every
trial records the fingerprint of its tokenizer (``Trial.tokenizer_fingerprint``), and
runs refuse trials whose fingerprint is not the model's
(:func:`locos_tl.trials.check_trials_tokenizer`).
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from locos_tl.errors import TrialError, warn_caller

#: ``"checkpoint"``: the checkpoint's rule (BOS iff its tokenizer prepends one);
#: ``"none"``: no special token is added (fragments, raw calibration text).
BosPolicy = Literal["checkpoint", "none"]
BOS_POLICIES: tuple[str, ...] = get_args(BosPolicy)

_OWN: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_RESOLVED: weakref.WeakSet[Any] = weakref.WeakSet()
#: reload -> the length of the given tokenizer it last followed (:func:`_follow_added`)
_FOLLOWED: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
#: tokenizer -> (its length, :func:`added_since_load`)
_ADDED: weakref.WeakKeyDictionary[Any, tuple[int, list[str]]] = weakref.WeakKeyDictionary()


def checkpoint_tokenizer(tokenizer: Any) -> Any:
    """The checkpoint's own tokenizer behind ``tokenizer``.

    A TransformerBridge (TransformerLens 4.3) loads its tokenizer with
    ``add_bos_token=True`` (``init_kwargs["add_bos_token"] is True``), which can add a
    BOS the checkpoint's tokenizer does not, and fills a missing ``bos_token`` with the
    EOS. Such a tokenizer is reloaded once from its ``name_or_path`` (local files only:
    the bridge has just read them) and the reload is cached; any other tokenizer is
    returned as it is. The reload follows the given tokenizer as it is now: tokens
    added to it after loading (``add_special_tokens``, ``add_tokens``; with their ids,
    flags and any BOS/EOS/pad/unk role given to them) are added to the reload too, so
    it encodes them whole and its fingerprint changes with them.

    Args:
        tokenizer: a Hugging Face fast tokenizer, or an object with a ``.tokenizer``
            (TransformerBridge).

    Returns:
        the tokenizer whose ``tokenizer(text)`` is the checkpoint's behaviour. If the
        reload fails, ``tokenizer`` itself, with a warning that its BOS behaviour may be
        the bridge's rather than the checkpoint's; the same, with a warning, when a
        token added to ``tokenizer`` gets another id in the reload.
    """
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    init = getattr(tok, "init_kwargs", None) or {}
    name = str(getattr(tok, "name_or_path", "") or "")
    if init.get("add_bos_token") is not True or not name:
        return tok
    try:
        if tok in _RESOLVED:
            return tok
    except TypeError:  # not weak-referenceable
        pass
    try:
        cached = _OWN.get(tok)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None:
        return _follow_added(tok, cached)
    try:
        from transformers import AutoTokenizer

        own = AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure: keep the given one
        warn_caller(
            f"could not reload the tokenizer of {name!r} without the bridge's "
            f"add_bos_token=True ({type(exc).__name__}: {exc}); prompts follow the given "
            "tokenizer's BOS behaviour, which may differ from the checkpoint's",
        )
        own = tok
    try:
        _OWN[tok] = own
        _RESOLVED.add(own)  # passing the reload back in never reloads it again
    except TypeError:
        pass
    return _follow_added(tok, own)


def _follow_added(tok: Any, own: Any) -> Any:
    """``own`` (the reload of ``tok``) given the tokens added to ``tok`` since it was
    loaded, in id order, with their flags and roles; ``tok`` itself, with a warning,
    where one of them gets another id in ``own``. A BOS, EOS or pad token the bridge
    added because the checkpoint has none is not followed."""
    try:
        if own is tok or len(tok) == _FOLLOWED.get(own, len(own)):
            return own
        mine = own.added_tokens_decoder
        filled = {str(getattr(tok, f"{r}_token")) for r in ("bos", "eos", "pad")
                  if getattr(own, f"{r}_token_id", None) is None
                  and getattr(tok, f"{r}_token", None) is not None}
        new = [(int(i), t) for i, t in sorted(tok.added_tokens_decoder.items())
               if int(i) not in mine and str(t) not in filled]
    except (TypeError, AttributeError):  # not a Hugging Face tokenizer: nothing to follow
        return own
    for _, t in new:
        own.add_tokens([t], special_tokens=bool(getattr(t, "special", False)))
    for role in SPECIAL_ROLES:  # a role given to an added token (add_special_tokens)
        s = getattr(tok, f"{role}_token", None)
        if s is not None and any(str(s) == str(t) for _, t in new):
            setattr(own, f"{role}_token", str(s))
    moved = [(str(t), i) for i, t in new if own.convert_tokens_to_ids(str(t)) != i]
    if moved:
        warn_caller(
            f"the tokens added to the tokenizer of {tok.name_or_path!r} after loading get "
            f"other ids in its reload ({moved[0][0]!r}: {moved[0][1]} there, "
            f"{own.convert_tokens_to_ids(moved[0][0])} here); prompts follow the given "
            "tokenizer, whose BOS behaviour may be the bridge's rather than the checkpoint's",
        )
        return tok
    _FOLLOWED[own] = len(tok)
    return own


def added_since_load(tokenizer: Any) -> list[str]:
    """The tokens added to a tokenizer after it was loaded from its files
    (``add_special_tokens``, ``add_tokens``), in id order: those of its
    ``added_tokens_decoder`` that its ``init_kwargs["added_tokens_decoder"]`` (what the
    files gave) lacks. ``[]`` for a tokenizer built in memory (no such record)."""
    tok = checkpoint_tokenizer(tokenizer)
    loaded = (getattr(tok, "init_kwargs", None) or {}).get("added_tokens_decoder")
    if not isinstance(loaded, dict):
        return []
    try:  # added tokens grow the tokenizer: its length tells when to look again
        size = len(tok)
        cached = _ADDED.get(tok)
        if cached is not None and cached[0] == size:
            return list(cached[1])
        ids = {int(i) for i in loaded}
        added = [str(t) for i, t in sorted(tok.added_tokens_decoder.items())
                 if int(i) not in ids]
    except (TypeError, AttributeError):  # no length, no added tokens: not followed
        return []
    try:
        _ADDED[tok] = (size, added)
    except TypeError:
        pass
    return list(added)


def prepended_ids(tokenizer: Any) -> list[int]:
    """The ids the checkpoint's tokenizer puts before the text (``[bos_id]`` or ``[]``).

    Found by encoding ``"a"`` with and without special tokens.
    """
    tok = checkpoint_tokenizer(tokenizer)
    plain = list(tok("a", add_special_tokens=False)["input_ids"])
    full = list(tok("a", add_special_tokens=True)["input_ids"])
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return full[:k]
    return []


def bos_id(tokenizer: Any) -> int | None:
    """The BOS id under the checkpoint's rule: its ``bos_token_id`` if its tokenizer
    prepends it to every prompt, else ``None`` (e.g. Qwen)."""
    tok = checkpoint_tokenizer(tokenizer)
    bid = getattr(tok, "bos_token_id", None)
    return int(bid) if bid is not None and int(bid) in prepended_ids(tok) else None


def encode_prompt(
    tokenizer: Any, text: str, *, bos: BosPolicy = "checkpoint"
) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets of a prompt under the one rule (module docstring).

    Args:
        tokenizer: a Hugging Face fast tokenizer or a TransformerBridge; the
            checkpoint's own tokenizer is used (:func:`checkpoint_tokenizer`).
        text: the whole prompt text (possibly rendered with a chat template).
        bos: ``"checkpoint"`` (default) adds what the checkpoint's tokenizer adds
            before a text (its BOS, or nothing), unless the text already starts with
            the BOS; ``"none"`` adds nothing (a BOS the text starts with stays).

    Returns:
        ``(ids, offsets)``: ``ids`` of length ``N``; ``offsets[i] = (a, b)`` is the
        character range of token ``i`` in ``text``, ``(0, 0)`` for an added BOS.

    Raises:
        TrialError: the text holds the checkpoint's BOS somewhere other than at its
            very start (the message gives the character offset), or the tokenizer is
            not a fast tokenizer (no offsets).
        ValueError: unknown ``bos`` policy.
    """
    if bos not in BOS_POLICIES:
        raise ValueError(f"unknown BOS policy {bos!r}; use one of {list(BOS_POLICIES)}")
    tok = checkpoint_tokenizer(tokenizer)
    if not getattr(tok, "is_fast", True):
        raise TrialError("a fast tokenizer (with character offsets) is needed to encode prompts")
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    ids = [int(i) for i in enc["input_ids"]]
    offsets = [(int(a), int(b)) for a, b in enc["offset_mapping"]]
    prefix = prepended_ids(tok)
    bid = getattr(tok, "bos_token_id", None)
    uses_bos = bid is not None and int(bid) in prefix
    if bos == "checkpoint" and prefix:
        if uses_bos and ids[:1] == [int(bid)]:  # the text writes the BOS itself
            prefix = [t for t in prefix if t != int(bid)]
        ids = prefix + ids
        offsets = [(0, 0)] * len(prefix) + offsets
    if uses_bos:
        stray = [i for i, t in enumerate(ids) if t == int(bid) and i > 0]
        if stray:
            raise TrialError(
                f"the prompt holds the BOS token {tok.bos_token!r} at token {stray[0]} "
                f"(character {offsets[stray[0]][0]}); BOS may only be at position 0 "
                "(was the text rendered with a chat template and then given a BOS, or "
                "are two prompts concatenated?)"
            )
    return ids, offsets


def encode_fragment(tokenizer: Any, text: str) -> list[int]:
    """Ids of a text that goes *inside* a prompt (filler, a name): no special tokens.

    Raises:
        TrialError: the fragment holds the checkpoint's BOS.
    """
    ids, _ = encode_prompt(tokenizer, text, bos="none")
    check_no_bos(tokenizer, ids, start=0, what="fragment")
    return ids


def check_no_bos(tokenizer: Any, ids: Sequence[int], *, start: int = 1,
                 what: str = "prompt") -> None:
    """Raise if the checkpoint's BOS occurs in ``ids[start:]``.

    Raises:
        TrialError: names the first position.
    """
    bid = bos_id(tokenizer)
    if bid is None:
        return
    for i in range(start, len(ids)):
        if int(ids[i]) == bid:
            raise TrialError(f"the {what} holds the BOS token (id {bid}) at position {i}; "
                             "BOS may only be at position 0 of a prompt")


# ------------------------------------------------------------------ tokenizer identity
#: What a fingerprint hashes; a change of the recipe changes this tag (and every
#: fingerprint with it).
FINGERPRINT_SCHEME = "locos-tokenizer-fingerprint/1"
#: The special tokens a fingerprint records, by role.
SPECIAL_ROLES: tuple[str, ...] = ("bos", "eos", "pad", "unk")

_FINGERPRINTS: weakref.WeakKeyDictionary[Any, tuple[Any, str]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class TokenizerIdentity:
    """Which tokenizer made a sequence of token ids.

    Attributes:
        fingerprint: :func:`tokenizer_fingerprint` (16 hex digits): equal fingerprints
            mean the same ids stand for the same tokens.
        name: a human name for messages (:func:`tokenizer_name`); not compared.
    """

    fingerprint: str
    name: str

    def __str__(self) -> str:
        return f"{self.name!r} (tokenizer fingerprint {self.fingerprint})"


def _special_tokens(tok: Any) -> dict[str, list[Any]]:
    """Role -> ``[token string or None, id or None]`` for :data:`SPECIAL_ROLES`."""
    out: dict[str, list[Any]] = {}
    for role in SPECIAL_ROLES:
        s = getattr(tok, f"{role}_token", None)
        i = getattr(tok, f"{role}_token_id", None)
        out[role] = [None if s is None else str(s), None if i is None else int(i)]
    return out


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short stable hash of a tokenizer's vocabulary and special tokens.

    SHA-256 over canonical JSON (sorted keys, ASCII escapes) of :data:`FINGERPRINT_SCHEME`,
    every ``(token, id)`` pair of ``get_vocab()`` (added tokens included), sorted by id
    then token, and the string and id of the ``bos``, ``eos``, ``pad`` and ``unk``
    tokens (``None`` where unset). No Python ``hash()``: the same tokenizer files give
    the same fingerprint in every process, machine and transformers version that reads
    them alike. The checkpoint's own tokenizer is hashed
    (:func:`checkpoint_tokenizer`): a TransformerBridge's tokenizer, which sets a
    missing BOS or pad token to the EOS, has the fingerprint of its checkpoint's; a
    token added to it at run time (``add_special_tokens``) is in the vocabulary hashed,
    as it is in the checkpoint's tokenizer given the same token.

    Args:
        tokenizer: a Hugging Face tokenizer, or an object with a ``.tokenizer``
            (TransformerBridge).

    Returns:
        16 lowercase hex digits, e.g. ``"3c0f6f1e0a7b95d2"``.

    Raises:
        TypeError: ``tokenizer`` has no ``get_vocab()`` (not a tokenizer; a model
            without a tokenizer).
    """
    tok = checkpoint_tokenizer(tokenizer)
    if not callable(getattr(tok, "get_vocab", None)):
        raise TypeError(f"cannot fingerprint a {type(tok).__name__}: it is not a tokenizer "
                        "(no get_vocab()); pass a Hugging Face tokenizer or a model with "
                        "a .tokenizer")
    special = _special_tokens(tok)
    try:  # a tokenizer that grew (add_tokens) or changed a special token is rehashed
        state = (len(tok), json.dumps(special, sort_keys=True))
    except TypeError:
        state = None
    try:
        cached = _FINGERPRINTS.get(tok)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None and state is not None and cached[0] == state:
        return cached[1]
    vocab = sorted(([str(t), int(i)] for t, i in tok.get_vocab().items()),
                   key=lambda p: (p[1], p[0]))
    payload = {"scheme": FINGERPRINT_SCHEME, "vocab": vocab, "special": special}
    blob = json.dumps(payload, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    fp = hashlib.sha256(blob.encode("ascii")).hexdigest()[:16]
    try:
        _FINGERPRINTS[tok] = (state, fp)
    except TypeError:
        pass
    return fp


def tokenizer_name(tokenizer: Any) -> str:
    """A human name of a tokenizer, for messages: the registry name of a prepared GGUF
    or elicited folder (``"smollm2-135m-instruct"``; its ``gguf_source.json``), else its
    ``name_or_path`` (hub id or folder), else ``"an unnamed tokenizer of N tokens"``;
    followed by the tokens added to it after loading (:func:`added_since_load`), e.g.
    ``"smollm2-135m-instruct + added '<doc>'"``."""
    tok = checkpoint_tokenizer(tokenizer)
    name = _file_name(tok)
    added = added_since_load(tok)
    if added:
        shown = ", ".join(repr(t) for t in added[:3]) + (", ..." if len(added) > 3 else "")
        name += f" + added {shown}" if len(added) == 1 else \
            f" + {len(added)} added tokens ({shown})"
    return name


def _file_name(tok: Any) -> str:
    """:func:`tokenizer_name` without the added tokens."""
    name = str(getattr(tok, "name_or_path", "") or "")
    if name:
        source = Path(name) / "gguf_source.json"
        try:
            if source.is_file():
                info = json.loads(source.read_text())
                return str(info.get("registry_name") or info.get("elicited")
                           or info.get("file_name") or name)
        except (OSError, ValueError):
            pass
        return name
    try:
        return f"an unnamed tokenizer of {len(tok)} tokens"
    except TypeError:
        return "an unnamed tokenizer"


def tokenizer_identity(tokenizer: Any) -> TokenizerIdentity:
    """:func:`tokenizer_fingerprint` and :func:`tokenizer_name` of ``tokenizer``.

    Raises:
        TypeError: not a tokenizer (see :func:`tokenizer_fingerprint`).
    """
    return TokenizerIdentity(tokenizer_fingerprint(tokenizer), tokenizer_name(tokenizer))


def model_tokenizer_identity(model: Any) -> TokenizerIdentity | None:
    """The identity of ``model``'s tokenizer, or None when it has none.

    A stand-in for a model (the distributed driver's, which holds no weights) can carry
    the identity itself as a ``tokenizer_identity`` attribute.
    """
    given = getattr(model, "tokenizer_identity", None)
    if isinstance(given, TokenizerIdentity):
        return given
    tok = getattr(model, "tokenizer", None)
    if tok is None or not callable(getattr(tok, "get_vocab", None)):
        return None
    return tokenizer_identity(tok)
