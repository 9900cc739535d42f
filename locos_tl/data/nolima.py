"""NoLiMa needle sets: parse, validate, expand, and build exact-length trials.

Format (Modarressi et al. 2025, "NoLiMa: Long-Context Evaluation Beyond Literal
Matching", arXiv 2502.05167; ``needle_set.json`` on the hub as ``amodaresi/NoLiMa``):
a JSON list of entries with ``id`` (e.g. ``"0401"``), ``reasoning_type``,
``system_prompt``, optional ``task_template`` (``{haystack}`` and ``{question}``
slots), ``needle`` (``{CHAR}`` and ``{1}``, ``{2}``, ... slots), ``questions`` (dict
keyed by question type: ``onehop``, ``twohop``, ...), ``character_set``, ``tests``
(``{test_id: {"input_args": [...], "gold_answers": ...}}``) and, in the
``_w_Distractor`` variant, ``distractors`` keyed by question type. Slot ``{i}`` is
``input_args[i - 1]``. The gold answer is the character name.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locos_tl.errors import DataFormatError

#: NoLiMa-style task template used when an entry has no ``task_template``.
DEFAULT_TASK_TEMPLATE = (
    "You will answer a question based on the following book snippet:\n\n{haystack}\n\n"
    "Use the information provided in the book snippet to answer the question. Your answer "
    "should be short and based on either explicitly stated facts or strong, logical "
    "inferences.\n\nQuestion: {question}\n\nReturn only the final answer with no "
    "additional explanation or reasoning."
)

#: Completion-style task template for base models (no chat template): the prompt ends
#: where the answer, the character's name, starts. Select it with ``template="completion"``.
COMPLETION_TASK_TEMPLATE = (
    "Read the following book snippet and answer the question after it.\n\n{haystack}\n\n"
    "Question: {question}\nAnswer: The character's name is"
)
#: Task templates selectable by name: ``default`` keeps each entry's own ``task_template``
#: (NoLiMa's chat-style :data:`DEFAULT_TASK_TEMPLATE` when it has none).
TASK_TEMPLATES: dict[str, str | None] = {"default": None, "completion": COMPLETION_TASK_TEMPLATE}


def prompt_form(template: str) -> dict[str, Any]:
    """:func:`~locos_tl.data.nolima_trials.build_nolima_trials` arguments for a prompt
    form: ``"chat"`` (the tokenizer's chat template around each entry's task) or
    ``"completion"`` (no chat template; :data:`COMPLETION_TASK_TEMPLATE`, for base
    models).

    Raises:
        DataFormatError: another form.
    """
    if template == "chat":
        return {"chat_template": True, "template": "default"}
    if template == "completion":
        return {"chat_template": False, "template": "completion"}
    raise DataFormatError(f"prompt form must be 'chat' or 'completion', not {template!r}")


def resolve_template(template: str, tokenizer: Any) -> str:
    """``"auto"``: ``"chat"`` when the tokenizer has a chat template, else
    ``"completion"``; any other value is checked and returned.

    Raises:
        DataFormatError: an unknown form, or ``"chat"`` for a tokenizer without one.
    """
    has_chat = bool(getattr(tokenizer, "chat_template", None))
    if template == "auto":
        return "chat" if has_chat else "completion"
    prompt_form(template)
    if template == "chat" and not has_chat:
        raise DataFormatError("the tokenizer has no chat template; use template "
                              "'completion' (or 'auto') for a base model")
    return template


#: Folder of the needle sets shipped with locos_tl (``<name>.json``).
NEEDLE_SETS_DIR = Path(__file__).parent / "needle_sets"

_SLOT = re.compile(r"\{([^{}]*)\}")
_REQUIRED = ("id", "needle", "questions", "character_set", "tests")


@dataclass(frozen=True)
class NoLiMaTest:
    """One test of an entry: the arguments filling the numbered slots."""

    test_id: str
    input_args: tuple[str, ...]
    gold_answers: tuple[str, ...] = ()


@dataclass(frozen=True)
class NoLiMaEntry:
    """One validated needle-set entry (see the module docstring for the fields)."""

    id: str
    reasoning_type: str
    system_prompt: str
    task_template: str
    needle: str
    questions: dict[str, str]
    character_set: tuple[str, ...]
    tests: dict[str, NoLiMaTest]
    distractors: dict[str, str]


@dataclass(frozen=True)
class NoLiMaItem:
    """One (entry, test, question type) with its slots filled except ``{CHAR}``."""

    entry_id: str
    test_id: str
    question_type: str
    reasoning_type: str
    system_prompt: str
    task_template: str
    needle: str  # still holds {CHAR}
    question: str  # may hold {CHAR}
    character_set: tuple[str, ...]
    distractor: str | None = None
    gold_answers: tuple[str, ...] = ()

    def realise(self, character: str) -> tuple[str, str, str]:
        """``(needle, question, answer)`` for one character; the answer is the name
        (or the test's first ``gold_answers`` entry with ``{CHAR}`` filled)."""
        needle = self.needle.replace("{CHAR}", character)
        question = self.question.replace("{CHAR}", character)
        answer = character
        if self.gold_answers:
            answer = self.gold_answers[0].replace("{CHAR}", character)
        return needle, question, answer


def nolima_seed(entry_id: str, haystack_index: int) -> int:
    """NoLiMa's seed rule: ``42 + int(entry_id[:4]) + haystack_index``.

    Raises:
        DataFormatError: the first four characters of the id are not digits.
    """
    head = entry_id[:4]
    if not head.isdigit():
        raise DataFormatError(f"entry id {entry_id!r} does not start with 4 digits (seed rule)")
    return 42 + int(head) + int(haystack_index)


def choose_characters(item: NoLiMaItem | NoLiMaEntry, haystack_index: int, k: int = 1) -> list[str]:
    """Seeded character choice for an entry in one haystack (NoLiMa seed rule).

    ``k = 1`` draws ``random.Random(seed).choice(character_set)``; ``k > 1`` draws
    ``random.Random(seed).sample(character_set, k)`` (distinct names).

    Raises:
        DataFormatError: ``k`` is not in ``1..len(character_set)``.
    """
    eid = item.entry_id if isinstance(item, NoLiMaItem) else item.id
    cs = list(item.character_set)
    if not 1 <= k <= len(cs):
        raise DataFormatError(
            f"entry {eid!r}: cannot draw {k} characters from a set of {len(cs)}"
        )
    rng = random.Random(nolima_seed(eid, haystack_index))
    return [rng.choice(cs)] if k == 1 else rng.sample(cs, k)


def shipped_needle_sets() -> list[str]:
    """Names of the needle sets shipped with locos_tl (e.g. ``["everyday"]``)."""
    return sorted(p.stem for p in NEEDLE_SETS_DIR.glob("*.json"))


def resolve_needle_set(name_or_path: str | Path) -> Path:
    """The file of a needle set: an existing path as is, else a shipped set's name.

    Args:
        name_or_path: a ``needle_set*.json`` path, or the bare name of a shipped set
            (:func:`shipped_needle_sets`, e.g. ``"everyday"``).

    Raises:
        DataFormatError: neither an existing file nor a shipped set's name (the message
            lists the shipped sets).
    """
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = str(name_or_path)
    shipped = shipped_needle_sets()
    if name in shipped:
        return NEEDLE_SETS_DIR / f"{name}.json"
    raise DataFormatError(
        f"needle set {name} does not exist: not a file and not a shipped set "
        f"(shipped: {', '.join(shipped) or 'none'})"
    )


def load_needle_set(path: str | Path) -> list[NoLiMaEntry]:
    """Read and validate a NoLiMa ``needle_set*.json`` file, or a shipped set by name.

    Args:
        path: a file, or the name of a shipped set (``"everyday"``; see
            :func:`resolve_needle_set`).

    Raises:
        DataFormatError: missing file or unknown name, invalid JSON, or an invalid entry
            (the message names the file, the entry id and the field).
    """
    path = resolve_needle_set(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"needle set {path} is not valid JSON ({exc})") from exc
    return parse_needle_set(data, source=str(path))


def parse_needle_set(data: Any, source: str = "needle set") -> list[NoLiMaEntry]:
    """Validate parsed needle-set JSON (a list of entries).

    Checks: required fields present and typed; ``needle`` has ``{CHAR}``; every
    numbered slot ``{i}`` in the needle, questions and distractors has an
    ``input_args[i-1]`` in every test; no unknown ``{...}`` slots; unique ids.

    Raises:
        DataFormatError: naming ``source``, the entry id and the field.
    """
    if not isinstance(data, list) or not data:
        raise DataFormatError(f"{source}: expected a non-empty JSON list of entries")
    out: list[NoLiMaEntry] = []
    seen: set[str] = set()
    for pos, raw in enumerate(data):
        entry = _parse_entry(raw, pos, source)
        if entry.id in seen:
            raise DataFormatError(f"{source}: entry {entry.id!r}: duplicate id")
        seen.add(entry.id)
        out.append(entry)
    return out


def expand_needle_set(
    entries: Sequence[NoLiMaEntry], question_types: Sequence[str] | None = None
) -> list[NoLiMaItem]:
    """One :class:`NoLiMaItem` per (entry, test, question type), in file order.

    Args:
        entries: validated entries.
        question_types: keep only these types (e.g. ``["onehop"]``); entries without
            them are skipped. ``None`` keeps all.

    Raises:
        DataFormatError: no entry has any of the requested question types.
    """
    items: list[NoLiMaItem] = []
    for en in entries:
        qtypes = list(en.questions) if question_types is None else [
            q for q in question_types if q in en.questions
        ]
        for test in en.tests.values():
            for qt in qtypes:
                dis = en.distractors.get(qt)
                items.append(NoLiMaItem(
                    entry_id=en.id,
                    test_id=test.test_id,
                    question_type=qt,
                    reasoning_type=en.reasoning_type,
                    system_prompt=en.system_prompt,
                    task_template=en.task_template,
                    needle=_fill(en.needle, test.input_args),
                    question=_fill(en.questions[qt], test.input_args),
                    character_set=en.character_set,
                    distractor=_fill(dis, test.input_args) if dis else None,
                    gold_answers=tuple(_fill(g, test.input_args) for g in test.gold_answers),
                ))
    if not items:
        have = sorted({q for en in entries for q in en.questions})
        raise DataFormatError(
            f"no entry has question type(s) {list(question_types or [])}; available: {have}"
        )
    return items


# --------------------------------------------------------------------- parsing
def _parse_entry(raw: Any, pos: int, source: str) -> NoLiMaEntry:
    if not isinstance(raw, dict):
        raise DataFormatError(f"{source}: entry #{pos} is not a JSON object")
    eid = raw.get("id")
    where = f"{source}: entry {eid!r}" if eid is not None else f"{source}: entry #{pos}"
    for f in _REQUIRED:
        if f not in raw:
            raise DataFormatError(f"{where}: missing field {f!r}")
    if not isinstance(eid, str) or not eid[:4].isdigit():
        raise DataFormatError(f"{where}: field 'id' must be a string starting with 4 digits")
    needle = _str(raw, "needle", where)
    if "{CHAR}" not in needle:
        raise DataFormatError(f"{where}: field 'needle' has no {{CHAR}} slot: {needle!r}")
    questions = _str_dict(raw, "questions", where)
    distractors: dict[str, str] = {}
    if raw.get("distractors") is not None:
        d = raw["distractors"]
        distractors = ({q: d for q in questions} if isinstance(d, str)
                       else _str_dict(raw, "distractors", where))
    chars = raw["character_set"]
    if (not isinstance(chars, list) or not chars
            or not all(isinstance(c, str) and c.strip() for c in chars)):
        raise DataFormatError(f"{where}: field 'character_set' must be a non-empty list of names")
    template = raw.get("task_template") or DEFAULT_TASK_TEMPLATE
    if (not isinstance(template, str) or "{haystack}" not in template
            or "{question}" not in template):
        raise DataFormatError(
            f"{where}: field 'task_template' needs {{haystack}} and {{question}} slots"
        )
    tests = _parse_tests(raw["tests"], where)
    templated = {"needle": needle, **{f"questions.{k}": v for k, v in questions.items()},
                 **{f"distractors.{k}": v for k, v in distractors.items()}}
    for test in tests.values():
        for i, g in enumerate(test.gold_answers):
            templated[f"tests.{test.test_id}.gold_answers[{i}]"] = g
    for field_name, text in templated.items():
        _check_slots(text, field_name, where, tests)
    return NoLiMaEntry(
        id=eid,
        reasoning_type=str(raw.get("reasoning_type") or ""),
        system_prompt=_opt_str(raw, "system_prompt", where),
        task_template=template,
        needle=needle,
        questions=questions,
        character_set=tuple(c.strip() for c in chars),
        tests=tests,
        distractors=distractors,
    )


def _parse_tests(raw: Any, where: str) -> dict[str, NoLiMaTest]:
    if not isinstance(raw, dict) or not raw:
        raise DataFormatError(f"{where}: field 'tests' must be a non-empty object")
    tests = {}
    for tid, t in raw.items():
        if not isinstance(t, dict) or "input_args" not in t:
            raise DataFormatError(f"{where}: field 'tests.{tid}' lacks 'input_args'")
        args = t["input_args"]
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise DataFormatError(
                f"{where}: field 'tests.{tid}.input_args' must be a list of strings"
            )
        gold = t.get("gold_answers") or []
        if isinstance(gold, str):
            gold = [gold]
        if not isinstance(gold, list) or not all(isinstance(g, str) and g.strip() for g in gold):
            raise DataFormatError(f"{where}: field 'tests.{tid}.gold_answers' must be strings")
        tests[str(tid)] = NoLiMaTest(str(tid), tuple(args), tuple(gold))
    return tests


def _check_slots(text: str, field_name: str, where: str, tests: dict[str, NoLiMaTest]) -> None:
    for m in _SLOT.finditer(text):
        slot = m.group(1)
        if slot == "CHAR":
            continue
        if not slot.isdigit() or int(slot) < 1:
            raise DataFormatError(
                f"{where}: field {field_name!r} has unknown slot {{{slot}}} "
                "(allowed: {CHAR}, {1}, {2}, ...)"
            )
        for t in tests.values():
            if int(slot) > len(t.input_args):
                raise DataFormatError(
                    f"{where}: field {field_name!r} uses slot {{{slot}}} but test "
                    f"{t.test_id!r} has only {len(t.input_args)} input_args"
                )


def _fill(text: str, args: Sequence[str]) -> str:
    return re.sub(r"\{(\d+)\}", lambda m: args[int(m.group(1)) - 1], text)


def _str(raw: dict[str, Any], key: str, where: str) -> str:
    v = raw[key]
    if not isinstance(v, str) or not v.strip():
        raise DataFormatError(f"{where}: field {key!r} must be a non-empty string")
    return v


def _opt_str(raw: dict[str, Any], key: str, where: str) -> str:
    v = raw.get(key)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DataFormatError(f"{where}: field {key!r} must be a string")
    return v


def _str_dict(raw: dict[str, Any], key: str, where: str) -> dict[str, str]:
    v = raw[key]
    if not isinstance(v, dict) or not v:
        raise DataFormatError(f"{where}: field {key!r} must be a non-empty object")
    for k, s in v.items():
        if not isinstance(s, str) or not s.strip():
            raise DataFormatError(f"{where}: field '{key}.{k}' must be a non-empty string")
    return dict(v)
