"""NoLiMa trials: the grid of (entry, test, question type) x haystack x character x
length x depth, sampled and rendered at exact lengths, with optional distractor needles
(:mod:`locos_tl.data.nolima` holds the needle sets themselves)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from locos_tl.data.grid import GridCell, stratified_sample
from locos_tl.data.haystack import Haystack
from locos_tl.data.nolima import (
    TASK_TEMPLATES,
    NoLiMaItem,
    choose_characters,
    nolima_seed,
)
from locos_tl.data.prompt import Insert, PromptBuilder, PromptTemplate
from locos_tl.errors import DataFormatError
from locos_tl.trials import Trial


def nolima_cells(
    items: Sequence[NoLiMaItem],
    haystacks: Sequence[Haystack],
    lengths: Sequence[int],
    depths: Sequence[float | int],
    characters_per_entry: int = 1,
) -> list[GridCell]:
    """The full grid: item x haystack x character x length x depth.

    Characters come from :func:`choose_characters` (NoLiMa seed rule per entry and
    haystack index).
    """
    cells: list[GridCell] = []
    for i, it in enumerate(items):
        for h in haystacks:
            for ch in choose_characters(it, h.index, characters_per_entry):
                for L in lengths:
                    for d in depths:
                        cells.append(GridCell(i, h.index, int(L), float(d), ch))
    return cells


def build_nolima_trials(
    tokenizer: Any,
    items: Sequence[NoLiMaItem],
    haystacks: Sequence[Haystack],
    *,
    lengths: Sequence[int],
    depths: Sequence[float | int],
    num_examples: int | None = None,
    characters_per_entry: int = 1,
    chat_template: bool = False,
    seed: int = 0,
    builder: PromptBuilder | None = None,
    template: str = "default",
    distractors: int = 0,
) -> list[Trial]:
    """Build NoLiMa trials with exact prompt lengths and needle spans.

    The needle is the scored span; a distractor (``_w_Distractor`` sets) goes in at a
    seeded random depth. ``num_examples`` trials are sampled from the grid, stratified
    by (entry, test, depth) with ``seed``.

    ``distractors`` > 0 also inserts that many needles of *other* entries (another
    fact), each with another character, at seeded random depths: a model that names a
    character must then tell the right needle from the wrong ones (chance is
    ``1 / (distractors + 1)`` among the names).

    Args:
        tokenizer: HF fast tokenizer (or model with ``.tokenizer``).
        items: from :func:`expand_needle_set`.
        haystacks: books; ``haystack.index`` enters the seed rule.
        lengths: prompt lengths in tokens (whole prompt, chat template included).
        depths: needle depths in percent of the haystack part.
        num_examples: sample size (``None``: the full grid).
        characters_per_entry: names drawn per entry and haystack.
        chat_template: render with the tokenizer's chat template (thinking disabled).
        seed: sampling seed.
        builder: reuse a :class:`PromptBuilder` (keeps tokenised books cached).
        template: ``"default"`` (each entry's ``task_template``, chat-style) or
            ``"completion"`` (:data:`COMPLETION_TASK_TEMPLATE`, for base models; use it
            without ``chat_template``); see :data:`TASK_TEMPLATES`.
        distractors: distractor needles per trial, from other entries of ``items``
            (each a random test of its entry), with names not used elsewhere in the
            trial.

    Returns:
        trials whose ``meta`` holds ``task``, ``entry_id``, ``test_id``,
        ``question_type``, ``reasoning_type``, ``character``, ``needle``,
        ``question``, ``distractor``, ``seed``, ``chat_template``, ``template`` and the
        builder's ``length``, ``depth``, ``depth_actual``, ``haystack``,
        ``haystack_index``. With ``distractors``: ``characters`` (one record per
        character in the prompt: ``name``, ``role`` ``"target"`` or
        ``"distractor"``, ``entry_id``, ``test_id``, ``needle``, ``depth`` and its token
        ``span``) and ``distractor_names``.

    Raises:
        HaystackTooShortError, TrialError, DataFormatError: see
            :meth:`PromptBuilder.build`; DataFormatError also for an unknown
            ``template``.
    """
    if template not in TASK_TEMPLATES:
        raise DataFormatError(
            f"unknown task template {template!r}; use one of {', '.join(TASK_TEMPLATES)}"
        )
    override = TASK_TEMPLATES[template]
    builder = builder or PromptBuilder(tokenizer)
    by_index = {h.index: h for h in haystacks}
    cells = nolima_cells(items, haystacks, lengths, depths, characters_per_entry)
    cells = stratified_sample(
        cells, num_examples,
        key=lambda c: (items[c.item].entry_id, items[c.item].test_id, c.depth), seed=seed,
    )
    trials = []
    for c in cells:
        it = items[c.item]
        hay = by_index[c.haystack_index]
        needle, question, answer = it.realise(c.character)
        prompt_template = PromptTemplate(override or it.task_template, it.system_prompt,
                                         chat_template)
        others = []
        if it.distractor:
            rng = random.Random(f"distractor:{it.entry_id}:{it.test_id}:{c.length}:{c.depth}")
            others.append(Insert(it.distractor.replace("{CHAR}", c.character),
                                 round(rng.uniform(0.0, 100.0), 2)))
        rivals = _distractor_needles(items, it, c, distractors, seed) if distractors else []
        others += [Insert(r["needle"], r["depth"]) for r in rivals]
        meta = dict(
            task="nolima", entry_id=it.entry_id, test_id=it.test_id,
            question_type=it.question_type, reasoning_type=it.reasoning_type,
            character=c.character, needle=needle, question=question,
            distractor=others[0].text if others else None,
            distractor_depth=others[0].depth if others else None,
            gold_answers=[g.replace("{CHAR}", c.character) for g in it.gold_answers] or [answer],
            seed=nolima_seed(it.entry_id, hay.index), chat_template=chat_template,
            template=template,
        )
        trial = builder.build(
            hay, length=c.length, template=prompt_template, question=question,
            needle=Insert(needle, c.depth), answer=answer, others=others, meta=meta,
        )
        if rivals:
            spans = trial.meta["insert_spans"][len(others) - len(rivals):]
            target = {"name": c.character, "role": "target", "entry_id": it.entry_id,
                      "test_id": it.test_id, "needle": needle, "depth": float(c.depth),
                      "span": list(trial.needle_span)}
            chars = [target] + [{**r, "span": sp} for r, sp in zip(rivals, spans, strict=True)]
            trial = dataclasses.replace(trial, meta={
                **trial.meta, "characters": chars,
                "distractor_names": [r["name"] for r in rivals]})
        trials.append(trial)
    return trials


def _distractor_needles(items: Sequence[NoLiMaItem], it: NoLiMaItem, cell: GridCell,
                        n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` needles of entries other than ``it``'s, each with a name not yet in the
    trial, at seeded random depths (one ``random.Random`` per trial cell)."""
    pool: dict[tuple[str, str], NoLiMaItem] = {}
    for other in items:
        if other.entry_id != it.entry_id:
            pool.setdefault((other.entry_id, other.test_id), other)
    entries = sorted({e for e, _ in pool})
    if len(entries) < n:
        raise DataFormatError(f"{n} distractor needles need {n} other entries; the items "
                              f"hold {len(entries)} besides {it.entry_id!r}")
    rng = random.Random(f"distractors:{seed}:{it.entry_id}:{it.test_id}:{cell.character}:"
                        f"{cell.length}:{cell.depth}:{cell.haystack_index}")
    used = {cell.character}
    out = []
    for entry in rng.sample(entries, n):
        tests = sorted(t for e, t in pool if e == entry)
        other = pool[entry, rng.choice(tests)]
        names = [x for x in other.character_set if x not in used]
        if not names:
            raise DataFormatError(f"entry {entry!r} has no name left for a distractor")
        name = rng.choice(names)
        used.add(name)
        needle, _, _ = other.realise(name)
        out.append({"name": name, "role": "distractor", "entry_id": other.entry_id,
                    "test_id": other.test_id, "needle": needle,
                    "depth": round(rng.uniform(0.0, 100.0), 2)})
    return out
