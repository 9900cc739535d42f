"""Every result number a reader can quote is bound to the file it comes from.

``docs/claims.csv`` lists one claim a row (``docs/claims.md`` says how to add one):

- ``page``: the README, a page under ``docs/``, a model card or a notebook;
- ``quote``: the page's own words, ending with the number (long enough to occur once);
- ``file``: the result file, from the repository root; or two published rankings, ``A vs
  B`` (folders with a ``head_scores.json``), whose agreement the package computes
  (``compare_rankings``, top 5, 10, 20 and 50: one row a layer bucket);
- ``row``: a pandas query for a CSV or JSON-lines file (``method == 'locos' and k == 5``),
  a JSON pointer for a JSON file (``/accuracy/book@1024/literal``), empty for a file of
  one row;
- ``column``: the column of a CSV or JSON-lines file (empty for JSON); several columns,
  comma-separated, give ``v`` as the list of their values (a list of such lists when the
  row matches several rows);
- several files, ``;``-separated with as many rows and columns, give ``v`` as the list of
  their values (a ratio of two files' numbers);
- ``rounding``: decimals (``2``: 0.17), or ``e0`` / ``e1`` for a p-value style 6e-41 /
  2.6e-5;
- ``derive`` (optional): a Python expression in ``v``, the value (a list when the row
  matches several rows, in file order): ``min(v)``, ``100 * (v - 1)``.

A claim with no ``file`` is a number no published file holds yet (a measurement kept in
a test's docstring, a table whose run was not published); its ``row`` says where it was
measured. Its quote is checked and covers its number; ``MAX_UNFILED`` caps how many there
are, so a new number comes with its file.

The checks: (1) the file's value, derived and rounded as stated, is the quoted number;
(2) the quote occurs exactly once on its page; (3) on a covered page every result-looking
number (a decimal, a p-value such as 6e-41, a percentage) ends some claim's quote, unless
it is in code or maths, or in a context of ``NOT_RESULTS``.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
CLAIMS = REPO / "docs" / "claims.csv"
COLUMNS = ["page", "quote", "file", "row", "column", "rounding", "derive"]

#: pages whose every result-looking number must be claimed
COVERED = ["README.md", "docs/index.md", "docs/concepts.md", "docs/organisms.md",
           "docs/real_models.md", "docs/real_models_ablation.md", "docs/real_models_checks.md",
           "docs/elicited.md",
           "notebooks/05_real_models.ipynb", "notebooks/06_elicited.ipynb"]

#: the number a quote ends with; its sign only where it is not a range's dash ("0.43-0.445")
#: nor the second half of "+-"
TRAILING = re.compile(r"(?:(?<![\w.+-])([-+\u2212]))?(\d+(?:\.\d+)?(?:e[-+]?\d+)?)$")
#: result-looking numbers: decimals, p-values (6e-41), percentages (44 %)
RESULT = re.compile(
    r"(?<![\w.])(?:\d+\.\d+(?:e[-+]?\d+)?|\d+e-\d+)(?![\w]|\.\d)"
    r"|(?<![\w.])\d+(?:\.\d+)?(?=\s?%)")
#: text a reader does not read as a result: fenced and inline code, maths, link targets
MASKED = [r"^\s*```.*?^\s*```", r"`[^`\n]*`", r"\\\(.*?\\\)", r"\$\$.*?\$\$",
          r"\]\([^)\s]*\)", r"<https?://[^>]*>", r"https?://\S+"]
#: numbers that are not results, by their context (each pattern names its kind)
NOT_RESULTS = {
    "paper id": r"arXiv\s+\d+\.\d+",
    "confidence level": r"\b95\s?%\s+(?:bootstrap\s+|confidence\s+|)(?:intervals?|CI)\b",
    "threshold or target": r"(?:(?<!-)[<>]=?|\u2265|\u2264|\bexceeds|\bwithin)\s?\d+(?:\.\d+)?",
    "KV-cache budget": r"\b\d+\s?%\s+of\s+the\s+(?:KV\s+)?cache\b",
    "needle depth": r"\bdepths?\s+\d+(?:/\d+)*\s?%(?:\s*\|\s*\d+\s?%)*|\b\d+\s?%\s+depth\b",
    "targets set before the run": r"\btargets\s+\([^)]*\)",
    "version or licence": r"\b(?:Apache-|Python\s+|v)\d+(?:\.\d+)+",
    "training setting": r"(?i)\b(?:KL(?:\s+weight)?|weight|learning\s+rate|lr)\s+\d+(?:\.\d+)?",
    "wall time of a run": r"\b\d+(?:\.\d+)?\s+(?:hours?|min|minutes?|seconds?|s|ms)\b",
    "share of the heads ablated": r"\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?%\s+of\s+"
                                  r"(?:the\s+heads|[\w.-]+'s(?:\s+heads)?)",
}
#: claims with no file, at most (see the module docstring)
MAX_UNFILED = 87


def page_text(page: str) -> str:
    """A page as a reader reads it: a Markdown file, or a notebook's markdown cells."""
    path = REPO / page
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return path.read_text()


def load_claims(path: Path = CLAIMS) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == COLUMNS, f"{path.name}: columns {reader.fieldnames}"
        return [{k: v or "" for k, v in row.items()} for row in reader]


@cache
def _table(file: str) -> pd.DataFrame:
    if " vs " in file:
        from locos_tl.experiments.compare import compare_rankings
        from locos_tl.heads import HeadScores

        a, b = (HeadScores.load(REPO / f) for f in file.split(" vs "))
        return compare_rankings(a, b, ks=(5, 10, 20, 50))
    path = REPO / file
    if path.suffix == ".jsonl":
        return pd.read_json(path, lines=True)
    return pd.read_csv(path)


@cache
def _rows(file: str, row: str) -> pd.DataFrame:
    return _table(file).query(row) if row else _table(file)


@cache
def _json(file: str):
    return json.loads((REPO / file).read_text())


def file_value(claim: dict[str, str]):
    """The value a claim points at: a float, or a list of floats when its row matches
    several rows. Raises ``LookupError`` naming what did not resolve."""
    file, row, column = claim["file"], claim["row"], claim["column"]
    if ";" in file:
        parts = [p.split(";") for p in (file, row, column)]
        if len({len(p) for p in parts}) > 1:
            raise LookupError(f"{file}: as many rows and columns as files, ';'-separated")
        return [file_value(dict(zip(("file", "row", "column"), (s.strip() for s in one),
                                    strict=True)))
                for one in zip(*parts, strict=True)]
    missing = [f for f in file.split(" vs ") if not (REPO / f).exists()]
    if missing:
        raise LookupError(f"no file {missing[0]}")
    if file.endswith(".json"):
        obj = _json(file)
        for key in row.split("/")[1:]:
            try:
                obj = obj[int(key) if isinstance(obj, list) else key]
            except (KeyError, IndexError, ValueError):
                raise LookupError(f"{file}: no {key!r} on the path {row!r}") from None
        return obj
    table = _table(file)
    columns = column.split(",")
    if missing := [c for c in columns if c not in table.columns]:
        raise LookupError(f"{file}: no column {missing[0]!r}")
    rows = _rows(file, row)
    if rows.empty:
        raise LookupError(f"{file}: no row where {row!r}")
    if len(columns) > 1:
        values = [[float(x) for x in r] for r in rows[columns].itertuples(index=False)]
        return values[0] if len(values) == 1 else values
    values = [float(x) for x in rows[column]]
    return values[0] if len(values) == 1 else values


def _over_rows(f):
    """``f`` over a list of rows' values; one row's value stays as it is."""
    return lambda v, *more: v if isinstance(v, float) and not more else f(v, *more)


def derived(claim: dict[str, str]) -> float:
    v = file_value(claim)
    if claim["derive"]:
        names = {"v": v, "abs": abs, "len": len, **{name: _over_rows(f) for name, f in (
            ("min", min), ("max", max), ("sum", sum), ("mean", statistics.fmean))}}
        v = eval(claim["derive"], {"__builtins__": {}, **names})  # noqa: S307  # our own table
    if isinstance(v, list):
        raise LookupError(f"{claim['file']}: {len(v)} rows where {claim['row']!r} "
                          "(narrow the row, or derive one value)")
    return float(v)


def quoted_number(quote: str) -> str:
    m = TRAILING.search(quote)
    if not m:
        raise ValueError(f"quote {quote!r} does not end with a number")
    sign = "-" if m.group(1) in ("-", "\u2212") else ""
    return sign + m.group(2)


def roundings(value: float, rounding: str) -> set[Decimal]:
    """``value`` rounded as stated: ties either way (a table may round 0.445 to 0.44 or
    0.45), and Python's formatting of the float itself."""
    if rounding.startswith("e"):
        digits = int(rounding[1:] or 0)
        return {Decimal(f"{value:.{digits}e}"),
                Decimal(f"{Decimal(repr(value)):.{digits}e}")}
    step = Decimal(1).scaleb(-int(rounding))
    exact = Decimal(repr(value))
    return {exact.quantize(step, ROUND_HALF_UP), exact.quantize(step, ROUND_HALF_EVEN),
            Decimal(f"{value:.{int(rounding)}f}")}


def check_value(claim: dict[str, str]) -> str | None:
    """Why the claim's file does not give its quoted number, or None."""
    try:
        shown = Decimal(quoted_number(claim["quote"]))
        value = derived(claim)
        ok = shown in roundings(value, claim["rounding"])
    except (LookupError, ValueError, SyntaxError, NameError, TypeError) as err:
        return f"{type(err).__name__}: {err}"
    return None if ok else f"the file gives {value!r}, shown as {shown} ({claim['rounding']})"


@cache
def find_quote(text: str, quote: str) -> list[int]:
    """Where ``quote`` ends on the page (the end of its number). A line break or several
    spaces on the page match one space of the quote, so rewrapping a paragraph keeps its
    claims; the quote starts at a word's start and its number is whole (0.5 is not 0.55)."""
    words = quote.split()
    start = r"(?<![\w.])" if re.match(r"\w", quote.strip()) else ""
    pattern = start + r"\s+".join(map(re.escape, words)) + r"(?!\d|\.\d)"
    return [m.end() for m in re.finditer(pattern, text)]


def check_quote(claim: dict[str, str], text: str) -> str | None:
    """Why the quote does not pin one place on the page, or None."""
    n = len(find_quote(text, claim["quote"]))
    return None if n == 1 else f"the quote occurs {n} times on the page"


def masked(text: str) -> str:
    """``text`` with code, maths, link targets and ``NOT_RESULTS`` blanked (offsets kept)."""
    for pattern in [*MASKED, *NOT_RESULTS.values()]:
        text = re.sub(pattern, lambda m: re.sub(r"\S", " ", m.group()), text,
                      flags=re.S | re.M)
    return text


def uncovered(text: str, quotes: list[str]) -> list[str]:
    """Result-looking numbers of ``text`` that end no quote: ``line N: number, context``."""
    ends = {end for q in quotes for end in find_quote(text, q)}
    found = []
    for m in RESULT.finditer(masked(text)):
        if m.end() not in ends:
            line = text.count("\n", 0, m.start()) + 1
            context = text[max(0, m.start() - 40):m.end() + 10].replace("\n", " ")
            found.append(f"line {line}: {m.group()}  ...{context}...")
    return found


def _claims_by_line() -> list[tuple[int, dict[str, str]]]:
    return list(enumerate(load_claims(), start=2))


def test_claims_match_their_files():
    bad = [f"claims.csv line {n} ({c['page']}: {c['quote']!r}): {err}"
           for n, c in _claims_by_line() if c["file"] and (err := check_value(c))]
    assert not bad, "\n".join(bad)


def test_claims_without_a_file_are_few():
    unfiled = [f"claims.csv line {n} ({c['page']}: {c['quote']!r}): {c['row']}"
               for n, c in _claims_by_line() if not c["file"]]
    assert len(unfiled) <= MAX_UNFILED, "numbers with no result file (publish the " \
        "file, or shorten the page):\n" + "\n".join(unfiled)


def test_claims_are_quoted_on_their_pages():
    bad = []
    for n, c in _claims_by_line():
        if not (REPO / c["page"]).is_file():
            bad.append(f"claims.csv line {n}: no page {c['page']}")
        elif err := check_quote(c, page_text(c["page"])):
            bad.append(f"claims.csv line {n} ({c['page']}: {c['quote']!r}): {err}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("page", COVERED)
def test_claims_cover_every_result_on_the_page(page):
    quotes = [c["quote"] for c in load_claims() if c["page"] == page]
    found = uncovered(page_text(page), quotes)
    assert not found, f"{page}: numbers no claim covers (add them to docs/claims.csv):\n" \
        + "\n".join(found)


def test_claims_checks_catch_a_mistyped_or_changed_number(tmp_path):
    """A number mistyped on the page, a value changed in its file, and a number no claim
    covers each fail."""
    claim = next(c for c in load_claims() if c["page"] == "README.md"
                 and c["file"].endswith(".csv") and not c["derive"])
    text = page_text(claim["page"])
    assert check_value(claim) is None and check_quote(claim, text) is None
    number = quoted_number(claim["quote"])
    typo = str(Decimal(number) + Decimal(1).scaleb(Decimal(number).as_tuple().exponent))
    edited = text.replace(claim["quote"], claim["quote"][: -len(number)] + typo, 1)
    assert check_quote(claim, edited) == "the quote occurs 0 times on the page"
    quotes = [c["quote"] for c in load_claims() if c["page"] == claim["page"]]
    assert not uncovered(text, quotes)
    assert [u.split()[2] for u in uncovered(edited, quotes)] == [typo]
    table = pd.read_csv(REPO / claim["file"])
    table.loc[table.query(claim["row"]).index, claim["column"]] += 0.05
    table.to_csv(tmp_path / "changed.csv", index=False)
    assert check_value({**claim, "file": str(tmp_path / "changed.csv")}).startswith(
        "the file gives")
