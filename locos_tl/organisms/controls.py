"""The organism's specificity control: a question it answers without a context.

The dissociation score of arXiv 2607.01002 (Sec. 4) needs control questions a model
answers from its weights, not from a context. The organism was trained on no fact it can
state without one: its only world knowledge, the hidden map ``city(landmark)``
(:data:`~locos_tl.organisms.vocab.CITY_OF`), is read only through the non-literal writer
heads (probed on the shipped checkpoint: ``<s> Q CITY`` ranks a landmark of that city
first for 1 of 24 cities; ``<s> LANDMARK`` ranks its city first among cities for 3 of 48
landmarks), so any readout of it would depend on the heads under test. The simplest
context-free question the organism does answer is the *echo*: the one-word prompt
``<s> w`` is continued with ``w`` (greedy, 100 of the 100 and 191 of the 200 most frequent
filler words on the shipped ``retrieval-2l``; nothing in it needs a haystack or a
needle). The organism keeps repeating the word, so score the echo with a budget of one
new token (``max_new_tokens=1``; ``locos ablate --control-max-new-tokens 1``).
"""

from __future__ import annotations

import random

from locos_tl.data.controls import build_control_trials
from locos_tl.data.hub import ControlExample
from locos_tl.organisms import vocab as V
from locos_tl.trials import Trial

#: The echo prompt is the word itself (the tokenizer prepends ``<s>``).
ECHO_TEMPLATE = "{question}"


def echo_examples(n: int = 50, *, seed: int = 0, top: int = 100) -> list[ControlExample]:
    """``n`` distinct filler words drawn from the ``top`` most frequent, each its own answer.

    Args:
        n: number of questions (``1 <= n <= top``).
        seed: sampling seed (``random.Random(seed)``); words keep frequency order.
        top: draw from this many most frequent filler words of the organism's vocabulary.

    Returns:
        :class:`~locos_tl.data.hub.ControlExample` list (question = answer = the word,
        ``meta["rank"]`` its frequency rank).

    Raises:
        ValueError: ``n`` outside ``1..top`` or ``top`` beyond the filler vocabulary.
    """
    words = V.filler_words()[0]
    if not 1 <= top <= len(words):
        raise ValueError(f"top={top}: the organism has {len(words)} filler words")
    if not 1 <= n <= top:
        raise ValueError(f"n={n}: choose 1..{top} echo questions")
    keep = sorted(random.Random(seed).sample(range(top), n))
    return [ControlExample(words[i], words[i], "echo", {"rank": i}) for i in keep]


def make_echo_trials(n: int = 50, *, seed: int = 0, top: int = 100) -> list[Trial]:
    """The organism's echo control trials: tokens ``[<s>, w]``, answer ``w``.

    Args:
        n, seed, top: see :func:`echo_examples`.

    Returns:
        Trials with ``meta["control"] == "echo"``; needle span ``(1, 2)`` (the word).
        Score with ``scorer="control"`` and ``max_new_tokens=1``.

    Raises:
        ValueError: see :func:`echo_examples`.
    """
    return build_control_trials(V.build_tokenizer(), echo_examples(n, seed=seed, top=top),
                                control="echo", template=ECHO_TEMPLATE)
