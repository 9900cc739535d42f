"""Literal needle-in-a-haystack (NIAH) probes and their trials.

Probe format (JSON lines, the probe set of the retrieval-head detector of Wu et al.
2025, "Retrieval Head Mechanistically Explains Long-Context Factuality", arXiv
2404.15574): one object a line with ``needle`` (the inserted sentence),
``question`` and ``real_needle`` (the answer part inside the needle). A trial's
``needle_span`` covers the whole needle sentence and its ``answer_span`` the
``real_needle`` part, which is also the gold answer: as in the authors' release,
LOCOS, attention-spatial, DLA and the HeadKV anchor variant read the whole needle, and
Wu et al.'s copy score and HeadKV (Fu et al. 2025, arXiv 2410.19258) read only
``real_needle`` (each detector's ``span``; docs/concepts.md, protocol table).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locos_tl.data.grid import GridCell, stratified_sample
from locos_tl.data.haystack import Haystack
from locos_tl.data.prompt import Insert, PromptBuilder, PromptTemplate
from locos_tl.errors import DataFormatError
from locos_tl.trials import Trial

#: Task template used for NIAH probes (book context, then the question).
NIAH_TASK_TEMPLATE = (
    "This is a very long story book: <book> {haystack} </book>.\n\n"
    "Based on the content of the book, Question: {question}\nAnswer:"
)
#: System prompt used for NIAH probes.
NIAH_SYSTEM_PROMPT = "You are a helpful assistant."
#: The LOCOS release's NIAH prompt (docs/concepts.md, protocol table): the context,
#: then the question, no system prompt (pass ``system_prompt=""``).
NIAH_RELEASE_TASK_TEMPLATE = (
    "{haystack}Based on the content of the book, Question: {question}\nAnswer:"
)


@dataclass(frozen=True)
class NiahProbe:
    """One NIAH probe.

    Attributes:
        needle: the sentence inserted into the haystack.
        question: the question asked after the haystack.
        real_needle: the answer text as given in the file.
        answer_range: ``[a, b)`` character range of ``real_needle`` inside ``needle``
            (matched case-insensitively, ignoring a trailing full stop, since
            published probes differ from their needle in case and punctuation).
        index: line number (1-based) in the file.
    """

    needle: str
    question: str
    real_needle: str
    answer_range: tuple[int, int]
    index: int = 0

    @property
    def answer(self) -> str:
        """The gold answer: the answer part as it appears inside the needle."""
        a, b = self.answer_range
        return self.needle[a:b]


def parse_niah_probe(d: Any, index: int = 0, source: str = "probe file") -> NiahProbe:
    """Validate one probe object.

    Raises:
        DataFormatError: a missing or empty field, or ``real_needle`` not inside the
            needle; the message names the source and line.
    """
    where = f"{source}:{index}"
    if not isinstance(d, dict):
        raise DataFormatError(f"{where}: expected a JSON object")
    for f in ("needle", "question", "real_needle"):
        if f not in d:
            raise DataFormatError(f"{where}: missing field {f!r}")
        if not isinstance(d[f], str) or not d[f].strip():
            raise DataFormatError(f"{where}: field {f!r} must be a non-empty string")
    needle = d["needle"].strip()
    rng = _locate(needle, d["real_needle"])
    if rng is None:
        raise DataFormatError(
            f"{where}: field 'real_needle' {d['real_needle']!r} does not occur in the needle "
            f"{needle!r}"
        )
    return NiahProbe(needle, d["question"].strip(), d["real_needle"], rng, index)


def load_niah_probes(path: str | Path) -> list[NiahProbe]:
    """Read a NIAH probe file (JSON lines; blank lines skipped).

    Raises:
        DataFormatError: missing file, bad JSON or an invalid probe (names the line).
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"NIAH probe file {path} does not exist")
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path}:{i}: not valid JSON ({exc})") from exc
        out.append(parse_niah_probe(d, i, str(path)))
    if not out:
        raise DataFormatError(f"NIAH probe file {path} has no probes")
    return out


def build_niah_trials(
    tokenizer: Any,
    probes: Sequence[NiahProbe],
    haystacks: Sequence[Haystack],
    *,
    lengths: Sequence[int],
    depths: Sequence[float | int],
    num_examples: int | None = None,
    chat_template: bool = False,
    seed: int = 0,
    task_template: str = NIAH_TASK_TEMPLATE,
    system_prompt: str = NIAH_SYSTEM_PROMPT,
    builder: PromptBuilder | None = None,
) -> list[Trial]:
    """Build NIAH trials: exact prompt length, needle span = the whole needle sentence,
    answer span = the tokens of ``real_needle``.

    The whole needle goes in at the sentence boundary nearest the depth; both spans
    are widened to whole tokens if the tokenizer merges their edges with neighbouring
    characters (e.g. a final ``.``). ``num_examples`` are sampled, stratified by
    (probe, depth).

    Returns:
        trials with ``meta``: ``task="niah"``, ``probe``, ``needle``, ``question``,
        ``real_needle``, ``chat_template`` and the builder's grid fields.

    Raises:
        HaystackTooShortError, TrialError, DataFormatError: see
            :meth:`PromptBuilder.build`.
    """
    builder = builder or PromptBuilder(tokenizer)
    template = PromptTemplate(task_template, system_prompt, chat_template)
    cells = [GridCell(i, h.index, int(L), float(d)) for i in range(len(probes))
             for h in haystacks for L in lengths for d in depths]
    cells = stratified_sample(cells, num_examples, key=lambda c: (c.item, c.depth), seed=seed)
    by_index = {h.index: h for h in haystacks}
    out = []
    for c in cells:
        p = probes[c.item]
        meta = dict(task="niah", probe=p.index, needle=p.needle, question=p.question,
                    real_needle=p.real_needle, chat_template=chat_template)
        out.append(builder.build(
            by_index[c.haystack_index], length=c.length, template=template,
            question=p.question,
            needle=Insert(p.needle, c.depth, strict=False, answer=p.answer_range),
            answer=p.answer, meta=meta,
        ))
    return out


def _locate(needle: str, real: str) -> tuple[int, int] | None:
    real = real.strip()
    for cand in (real, real.rstrip(".")):
        if not cand:
            continue
        a = needle.find(cand)
        if a < 0:
            a = needle.lower().find(cand.lower())
        if a >= 0:
            return a, a + len(cand)
    return None
