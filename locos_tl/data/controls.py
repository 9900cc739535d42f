"""Specificity-control trials: parametric-knowledge and 1-digit arithmetic questions.

The dissociation score ``DS(k) = (R0 - R(k)) / R0 - (P0 - P(k)) / P0`` of Gema, Alex &
Minervini (2026, arXiv 2607.01002, Sec. 4) compares the drop in retrieval after ablating
the top-k heads with the drop on questions a model answers from its weights, not from a
context: city -> country and popular-entity facts, and 1-digit arithmetic. This module
builds those control trials:

- :func:`build_parametric_trials`: facts shipped with locos_tl (``controls.json``,
  written for locos_tl: 65 city -> country facts and 30 popular-entity facts, each
  answer with its accepted aliases).
- :func:`build_arithmetic_trials`: 1-digit ``a + b``, ``a - b`` (``a >= b``) and
  ``a * b`` questions drawn without replacement with a seed.
- :func:`build_control_trials`: any list of
  :class:`~locos_tl.data.hub.ControlExample` (e.g. the authors' set from
  :func:`~locos_tl.data.hub.load_parametric_controls`).

A control trial has no haystack. Its needle span is the question inside the prompt (a
nominal span: ablation and its metric do not read it; it keeps the trial a valid
:class:`~locos_tl.trials.Trial`). ``meta`` holds ``control`` (``"parametric"`` or
``"arithmetic"``), ``category`` and ``answer_aliases``. Score the responses with
``scorer="control"`` (:func:`locos_tl.experiments.task_metrics.score_control`: exact match after
lower-casing and stripping, as the authors' release does).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

from locos_tl.data.hub import ControlExample
from locos_tl.errors import DataFormatError, TrialError
from locos_tl.trials import Trial

#: Default prompt around a control question (the NIAH prompt of the authors' release ends
#: in ``"Question: {question}\\nAnswer:"``); responses stop at the newline.
CONTROL_TEMPLATE = "Question: {question}\nAnswer:"
#: Categories of the shipped parametric facts.
PARAMETRIC_KINDS = ("city_country", "entity")
#: Operators of the arithmetic control.
ARITHMETIC_OPS = ("+", "-", "*")


@lru_cache(maxsize=1)
def _facts() -> dict[str, Any]:
    text = resources.files("locos_tl.data").joinpath("controls.json").read_text()
    return json.loads(text)


def parametric_examples(kinds: Sequence[str] = PARAMETRIC_KINDS) -> list[ControlExample]:
    """The shipped parametric-knowledge questions, in file order.

    Args:
        kinds: ``"city_country"`` ("In which country is the city of Lyon?" -> "France")
            and/or ``"entity"`` (popular-entity facts, e.g. "Who painted the Mona Lisa?"
            -> "Leonardo da Vinci").

    Returns:
        :class:`~locos_tl.data.hub.ControlExample` list; ``meta["answer_aliases"]``
        lists the other accepted answers.

    Raises:
        ValueError: an unknown kind.
    """
    bad = [k for k in kinds if k not in PARAMETRIC_KINDS]
    if bad or not kinds:
        raise ValueError(f"unknown parametric kind(s) {bad or list(kinds)}; use "
                         f"{list(PARAMETRIC_KINDS)}")
    data = _facts()
    out: list[ControlExample] = []
    if "city_country" in kinds:
        cc = data["city_country"]
        for city, country in cc["facts"].items():
            out.append(ControlExample(
                cc["template"].format(city=city), country, "city_country",
                {"subject": city, "answer_aliases": list(cc["aliases"].get(country, []))}))
    if "entity" in kinds:
        for d in data["entity"]:
            out.append(ControlExample(d["question"], d["answer"], "entity",
                                      {"answer_aliases": list(d["aliases"])}))
    return out


def arithmetic_examples(
    n: int = 50, *, ops: Sequence[str] = ARITHMETIC_OPS, seed: int = 0
) -> list[ControlExample]:
    """1-digit arithmetic questions ("What is 3 + 4?" -> "7"), drawn with a seed.

    Operands are 1..9; subtraction keeps ``a >= b`` (answers are never negative);
    ``*`` is written as ``*``. Questions are distinct (drawn without replacement from
    all ``(a, op, b)`` cells of ``ops``) and spread evenly over the operators.

    Args:
        n: number of questions (at most the number of distinct cells: 81 per ``+`` or
            ``*``, 45 for ``-``).
        ops: operators, a subset of ``("+", "-", "*")``.
        seed: RNG seed (``random.Random(seed)``).

    Returns:
        :class:`~locos_tl.data.hub.ControlExample` list with ``category`` the operator
        and ``meta`` ``{"a": a, "op": op, "b": b}``.

    Raises:
        ValueError: an unknown operator, ``n < 1`` or more questions than cells.
    """
    bad = [o for o in ops if o not in ARITHMETIC_OPS]
    if bad or not ops:
        raise ValueError(f"unknown operator(s) {bad or list(ops)}; use {list(ARITHMETIC_OPS)}")
    ops = list(dict.fromkeys(ops))
    cells = {o: [(a, b) for a in range(1, 10) for b in range(1, 10) if o != "-" or a >= b]
             for o in ops}
    total = sum(len(c) for c in cells.values())
    if not 1 <= n <= total:
        raise ValueError(f"n={n}: choose 1..{total} arithmetic questions for ops {ops}")
    rng = random.Random(seed)
    for c in cells.values():
        rng.shuffle(c)
    picked: list[tuple[int, str, int]] = []
    i = 0
    while len(picked) < n:  # round robin over the operators (even spread)
        o = ops[i % len(ops)]
        if cells[o]:
            a, b = cells[o].pop()
            picked.append((a, o, b))
        i += 1
    rng.shuffle(picked)
    value = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
    return [ControlExample(f"What is {a} {o} {b}?", str(value[o](a, b)), o,
                           {"a": a, "op": o, "b": b}) for a, o, b in picked]


def build_control_trials(
    tokenizer: Any,
    examples: Sequence[ControlExample],
    *,
    control: str,
    template: str = CONTROL_TEMPLATE,
    chat_template: bool = False,
    n_ctx: int | None = None,
) -> list[Trial]:
    """Tokenize control questions into :class:`~locos_tl.trials.Trial` objects.

    Args:
        tokenizer: the model's Hugging Face fast tokenizer (or a bridge with
            ``.tokenizer``).
        examples: questions and answers (``meta["answer_aliases"]`` is kept).
        control: the control's name, stored as ``meta["control"]`` (``"parametric"``,
            ``"arithmetic"``, ...).
        template: prompt text with one ``{question}`` slot.
        chat_template: render the filled template as the user turn of the tokenizer's
            chat template (generation prompt added, thinking disabled).
        n_ctx: the model's context length; longer prompts are rejected.

    Returns:
        One trial per example: needle span = the question's tokens, answer = the gold
        answer, ``meta``: ``control``, ``category``, ``index``, ``answer_aliases`` and the
        example's own metadata.

    Raises:
        DataFormatError: the template lacks ``{question}``; ``chat_template`` with a
            tokenizer that has none.
        TrialError: an empty answer; a question not aligned to whole tokens.
    """
    if template.count("{question}") != 1:
        raise DataFormatError(f"control template needs exactly one {{question}} slot: "
                              f"{template[:80]!r}")
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    out = []
    for i, ex in enumerate(examples):
        text = template.replace("{question}", ex.question)
        if chat_template:
            text = _chat(tok, text)
        meta = {"control": control, "category": ex.category, "index": i, **ex.meta}
        meta["answer_aliases"] = [str(a) for a in ex.meta.get("answer_aliases", [])]
        try:
            t = Trial.from_text(tok, text, ex.question, ex.answer, n_ctx=n_ctx, meta=meta)
        except TrialError as exc:
            raise TrialError(f"control question {i} ({ex.question[:60]!r}): {exc}") from exc
        out.append(t)
    return out


def build_parametric_trials(
    tokenizer: Any,
    *,
    n: int | None = None,
    kinds: Sequence[str] = PARAMETRIC_KINDS,
    seed: int = 0,
    template: str = CONTROL_TEMPLATE,
    chat_template: bool = False,
    n_ctx: int | None = None,
) -> list[Trial]:
    """Parametric-knowledge control trials from the shipped facts.

    Args:
        tokenizer: the model's tokenizer (or a bridge).
        n: sample this many questions (``random.Random(seed)``, file order kept);
            ``None``: all of ``kinds`` (95 with both kinds).
        kinds: ``"city_country"`` and/or ``"entity"``.
        seed: sampling seed.
        template, chat_template, n_ctx: see :func:`build_control_trials`.

    Returns:
        Trials with ``meta["control"] == "parametric"``.

    Raises:
        ValueError: an unknown kind; ``n`` outside ``1..available``.
        DataFormatError, TrialError: see :func:`build_control_trials`.
    """
    exs = parametric_examples(kinds)
    if n is not None:
        if not 1 <= n <= len(exs):
            raise ValueError(f"n={n}: choose 1..{len(exs)} parametric questions for {kinds}")
        keep = sorted(random.Random(seed).sample(range(len(exs)), n))
        exs = [exs[i] for i in keep]
    return build_control_trials(tokenizer, exs, control="parametric", template=template,
                                chat_template=chat_template, n_ctx=n_ctx)


def build_arithmetic_trials(
    tokenizer: Any,
    *,
    n: int = 50,
    ops: Sequence[str] = ARITHMETIC_OPS,
    seed: int = 0,
    template: str = CONTROL_TEMPLATE,
    chat_template: bool = False,
    n_ctx: int | None = None,
) -> list[Trial]:
    """1-digit arithmetic control trials (:func:`arithmetic_examples`).

    Args:
        tokenizer: the model's tokenizer (or a bridge).
        n, ops, seed: see :func:`arithmetic_examples`.
        template, chat_template, n_ctx: see :func:`build_control_trials`.

    Returns:
        Trials with ``meta["control"] == "arithmetic"``.

    Raises:
        ValueError: see :func:`arithmetic_examples`.
        DataFormatError, TrialError: see :func:`build_control_trials`.
    """
    return build_control_trials(tokenizer, arithmetic_examples(n, ops=ops, seed=seed),
                                control="arithmetic", template=template,
                                chat_template=chat_template, n_ctx=n_ctx)


def _chat(tok: Any, user: str) -> str:
    if not getattr(tok, "chat_template", None):
        raise DataFormatError("the tokenizer has no chat template; build without "
                              "--chat-template")
    return str(tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False))
