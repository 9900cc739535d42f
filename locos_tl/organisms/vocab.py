"""Vocabulary and word-level tokenizer of the model organism.

The organism reads whole words: special tokens, a question marker ``Q``, capitalised
entity words (character names, landmarks, cities) and a frequency-ordered list of
lowercase English filler words (``words_en.txt``, the 3000 most frequent ``[a-z]+``
words of ``wordfreq`` 3.1.1). Every other word maps to ``<unk>``.

The hidden map ``city(landmark)`` (:data:`CITY_OF`) is real-world knowledge: the
organism learns it only from its training data; it never appears in a prompt.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

PAD, UNK, BOS, EOS, QMARK = "<pad>", "<unk>", "<s>", "</s>", "Q"
#: The human name trials built from this vocabulary record (:func:`tokenizer_identity`).
TOKENIZER_NAME = "locos_tl organism vocabulary"
SPECIALS: tuple[str, ...] = (PAD, UNK, BOS, EOS, QMARK)

#: Character names (the non-literal answers). Capitalised, one token each; chosen to
#: avoid the main characters of the shipped haystack books.
NAMES: tuple[str, ...] = (
    "Olivia", "Liam", "Emma", "Noah", "Ava", "Oliver", "Sophia", "Elijah", "Isabella",
    "James", "Amelia", "Benjamin", "Harper", "Lucas", "Evelyn", "Henry", "Abigail",
    "Alexander", "Emily", "Daniel", "Ella", "Michael", "Scarlett", "Mason", "Grace",
    "Logan", "Chloe", "Ethan", "Victoria", "Jacob", "Riley", "Jackson", "Aria",
    "Sebastian", "Zoey", "Aiden", "Nora", "Matthew", "Hazel", "Samuel", "Ellie",
    "Owen", "Stella", "Wyatt", "Leah", "Caleb", "Violet", "Isaac",
)

#: Hidden map landmark -> city (two landmarks per city).
CITY_OF: dict[str, str] = {
    "Colosseum": "Rome", "Pantheon": "Rome",
    "Louvre": "Paris", "Versailles": "Paris",
    "Westminster": "London", "Buckingham": "London",
    "Acropolis": "Athens", "Parthenon": "Athens",
    "Pyramids": "Cairo", "Sphinx": "Cairo",
    "Kremlin": "Moscow", "Bolshoi": "Moscow",
    "Alhambra": "Granada", "Albaicin": "Granada",
    "Sagrada": "Barcelona", "Montjuic": "Barcelona",
    "Rialto": "Venice", "Murano": "Venice",
    "Reichstag": "Berlin", "Brandenburg": "Berlin",
    "Topkapi": "Istanbul", "Galata": "Istanbul",
    "Kinkakuji": "Kyoto", "Fushimi": "Kyoto",
    "Tiananmen": "Beijing", "Badaling": "Beijing",
    "Rijksmuseum": "Amsterdam", "Vondelpark": "Amsterdam",
    "Hradcany": "Prague", "Vysehrad": "Prague",
    "Uffizi": "Florence", "Duomo": "Florence",
    "Schonbrunn": "Vienna", "Belvedere": "Vienna",
    "Prado": "Madrid", "Retiro": "Madrid",
    "Corcovado": "Rio", "Copacabana": "Rio",
    "Hermitage": "Petersburg", "Peterhof": "Petersburg",
    "Vesuvius": "Naples", "Pompeii": "Naples",
    "Zwinger": "Dresden", "Frauenkirche": "Dresden",
    "Capitol": "Washington", "Smithsonian": "Washington",
    "Giralda": "Seville", "Alcazar": "Seville",
}
LANDMARKS: tuple[str, ...] = tuple(CITY_OF)
CITIES: tuple[str, ...] = tuple(dict.fromkeys(CITY_OF.values()))


@lru_cache(maxsize=1)
def filler_words() -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The filler vocabulary, most frequent first, and each word's corpus frequency.

    Lowercase forms of entity words (``"paris"``, ``"grace"``) are removed, so filler
    never spells an entity.

    Returns:
        ``(words, freqs)``: equal-length tuples; ``freqs`` are wordfreq frequencies
        (fraction of running English text).
    """
    entity_lower = {w.lower() for w in (*NAMES, *LANDMARKS, *CITIES, QMARK)}
    words: list[str] = []
    freqs: list[float] = []
    text = resources.files("locos_tl.organisms").joinpath("words_en.txt").read_text()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        w, f = line.split("\t")
        if w in entity_lower:
            continue
        words.append(w)
        freqs.append(float(f))
    return tuple(words), tuple(freqs)


@lru_cache(maxsize=1)
def vocab_list() -> tuple[str, ...]:
    """All tokens in id order: specials, names, landmarks, cities, filler words."""
    return (*SPECIALS, *NAMES, *LANDMARKS, *CITIES, *filler_words()[0])


@lru_cache(maxsize=1)
def token_to_id() -> dict[str, int]:
    """Token string -> id (the order of :func:`vocab_list`)."""
    return {w: i for i, w in enumerate(vocab_list())}


def build_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over :func:`vocab_list`.

    Splits on whitespace only, maps unknown words to ``<unk>``, prepends ``<s>``
    (``add_special_tokens=True``) and decodes by joining words with single spaces.

    Returns:
        ``transformers.PreTrainedTokenizerFast`` with bos/eos/unk/pad tokens set, named
        :data:`TOKENIZER_NAME` (``name_or_path``; not written by ``save_pretrained``).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = token_to_id()
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
    )
    out.name_or_path = TOKENIZER_NAME
    return out


@lru_cache(maxsize=1)
def tokenizer_identity() -> Any:
    """The fingerprint and name of the organism vocabulary's tokenizer
    (:func:`locos_tl.tokenize.tokenizer_identity` of :func:`build_tokenizer`): the
    fingerprint every organism checkpoint's saved tokenizer has, and the one organism
    trials (:func:`locos_tl.organisms.make_trials`) record.

    Returns:
        a :class:`locos_tl.tokenize.TokenizerIdentity`.
    """
    from locos_tl.tokenize import tokenizer_identity as identity

    return identity(build_tokenizer())
