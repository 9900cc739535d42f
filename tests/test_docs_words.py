"""What a reader sees says what the code does now.

Checked in the README, every page under ``docs/``, the notebooks (their cell sources in
``notebooks/cells_*.py`` and the committed ``.ipynb`` files, outputs included) and the
model cards: no lab-log words (issues, sessions, CI runs, other jobs), no deprecated
names, no relative link or ``.md`` reference to a file that does not exist, one wording
of CRI's direction and one torch install line. ``CHANGELOG.md`` keeps the history and is
not checked."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: lab-log words: history and the circumstances of a run belong in CHANGELOG.md
LAB_LOG = [
    r"\bissues?\b",
    r"\bsessions?\b",
    r"\b(?:a|the) CI run\b",
    r"\banother job\b",
    r"\bother jobs\b",
    r"\bstop \d",
    r"\blab[- ]?log\b",
]
#: legitimate uses of a lab-log word, removed before the check (keep this short)
ALLOWED = [
    r"GitHub issue #\d+",  # citing an upstream bug by its number
]
#: lab-log phrases once met in the docs: each tells when, or in which order, a result was
#: made instead of what it is (checked everywhere a reader looks)
LAB_LOG_PHRASES = [
    "the search went down, not up", "that was noise", "can now be measured",
    "`locos elicit` now puts", "the cells were rerun", "an earlier unpublished round",
    "first attempt", "generated again", "were rerun", "since it was introduced",
    "calibrated again on another machine", "calibrating again",
]
#: the patterns behind them, in the prose of the README, docs/*.md and the notebooks'
#: markdown: "now" (against an earlier state), a rerun, "again", an earlier attempt or round
LAB_LOG_PROSE = [
    r"\bnow\b",
    r"\bre-?run",
    r"\bagain\b",
    r"\bfirst attempt\b",
    r"\b(?:an? |the )?(?:earlier|previous|first|second) (?:attempt|round|try|pass of the run)\b",
    r"\bno longer\b",
    r"\bused to\b",
]
#: legitimate prose that matches LAB_LOG_PROSE (keep this short)
PROSE_ALLOWED = [
    r"\bno longer takes the name\b",  # what an ablated model does, not the project's past
]
#: names the package renamed or deprecated: the docs show the new ones
DEPRECATED = {
    r"\bload_evaluation\b": "load_ablation_sweep",
    r"\bphi_layer\b": "phi_from_pattern",
    r"\bphi_tensor\b": "phi_from_model",
    r"\bcli/ablate_tf\.py\b": "cli/ablate_teacher_forced.py",
    r"(?<![\w.])(?:lt\.|locos_tl\.)?evaluate\(": "ablation_sweep(...)",
    r"\bray_address=": "workers=RayWorkers(n, address=...)",
    r"\bstop_at_newline\b": "stop_rule=",
    r"--no-stop-at-newline": "--stop-rule none",
}
#: CRI's direction, in the same words everywhere it is described
CRI_WORDING = ("the clean run's `hook_z` of one head, patched into the corrupted run at "
               "every position")
CRI_PLACES = [
    "docs/concepts.md", "docs/real_models_checks.md", "docs/elicited.md",
    "docs/benchmarks.md", "notebooks/cells_experiments.py", "locos_tl/organisms/card.py",
    "data/organisms/retrieval-2l/MODEL_CARD.md", "data/organisms/retrieval-long/MODEL_CARD.md",
    "data/organisms/retrieval-2l-compiled/MODEL_CARD.md",
]
#: the one torch install line (the CPU build from PyTorch's own index)
TORCH_LINE = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_PLACES = ["README.md", "docs/install.md", "scripts/setup.sh"]


def _notebook_text(path: Path) -> str:
    """Cell sources and text outputs of a notebook (images and HTML left out)."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        parts.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append("".join(out["text"]))
            data = out.get("data", {})
            for kind in ("text/plain", "text/markdown"):
                if kind in data:
                    parts.append("".join(data[kind]))
    return "\n".join(parts)


def _reader_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
             *sorted((REPO / "notebooks").glob("cells_*.py")),
             *sorted((REPO / "notebooks").glob("*.ipynb")),
             *sorted((REPO / "data" / "organisms").glob("*/MODEL_CARD.md"))]
    return [f for f in files if f.name != "CHANGELOG.md"]


FILES = _reader_files()
IDS = [str(f.relative_to(REPO)) for f in FILES]


def _text(path: Path) -> str:
    return _notebook_text(path) if path.suffix == ".ipynb" else path.read_text()


def _where(text: str, start: int) -> str:
    line = text.count("\n", 0, start) + 1
    return f"line {line}: {text.splitlines()[line - 1].strip()[:100]!r}"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_lab_log_words(path):
    text = _text(path)
    for allowed in ALLOWED:
        text = re.sub(allowed, lambda m: " " * len(m.group()), text)
    found = [f"{pat}: {_where(text, m.start())}" for pat in LAB_LOG
             for m in re.finditer(pat, text, flags=re.I)]
    assert not found, "\n".join(found)


#: a comment or docstring that names an issue of this project by its number: it says
#: where a change came from, not why the code is as it is
ISSUE_NUMBER = r"\bissues?\s*#?\d+"
SOURCES = sorted(p for part in ("locos_tl", "tests", "benchmarks", "experiments",
                                "scripts")
                 for p in (REPO / part).rglob("*.py"))


def test_no_source_file_cites_an_issue_number():
    found = [f"{p.relative_to(REPO)} {_where(t, m.start())}" for p in SOURCES
             for t in [p.read_text()] for m in re.finditer(ISSUE_NUMBER, t, flags=re.I)]
    assert not found, "\n".join(found)
    assert re.search(ISSUE_NUMBER, "(" + "Issue" + " 19: a float32 run", flags=re.I)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_lab_log_phrases(path):
    text = " ".join(_text(path).split())
    found = [p for p in LAB_LOG_PHRASES if p.lower() in text.lower()]
    assert not found, found


def _prose(path: Path) -> str:
    """The prose a reader reads: a page without its fenced code, or a notebook's
    markdown cells."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    else:
        text = path.read_text()
    return re.sub(r"^```.*?^```", lambda m: "\n" * m.group().count("\n"), text,
                  flags=re.S | re.M)


PROSE = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
         *sorted((REPO / "notebooks").glob("*.ipynb"))]


def _prose_hits(text: str) -> list[str]:
    for allowed in PROSE_ALLOWED:
        text = re.sub(allowed, lambda m: " " * len(m.group()), text)
    return [f"{pat}: {_where(text, m.start())}" for pat in LAB_LOG_PROSE
            for m in re.finditer(pat, text, flags=re.I)]


@pytest.mark.parametrize("path", PROSE, ids=[str(p.relative_to(REPO)) for p in PROSE])
def test_no_lab_log_prose(path):
    """Results and instructions are stated as they are, not against an earlier state."""
    found = _prose_hits(_prose(path))
    assert not found, "\n".join(found)


def test_lab_log_checks_catch_what_they_should():
    general = ["The sweep now runs once.", "At k = 5 the cells were rerun.",
               "Rerunning resumes.", "The means, calibrated again, differ.",
               "An earlier round gave 0.92.", "The first attempt decoded 16 tokens.",
               "It no longer stops.", "The sweep used to run twice."]
    for sentence in general:
        assert _prose_hits(sentence), sentence
    for fine in ["What the model knows.", "The known heads.", "A second model.",
                 "Run the same command; finished trials are skipped.",
                 "The model no longer takes the name from the context."]:
        assert not _prose_hits(fine), fine


def _calls(text: str, name: str) -> list[tuple[int, str]]:
    """``(offset, argument text)`` of every call ``name(...)``, parentheses balanced."""
    out = []
    for m in re.finditer(rf"\b{re.escape(name)}\(", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append((m.start(), text[m.end():i - 1]))
    return out


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_no_deprecated_names(path):
    text = _text(path)
    found = [f"{pat} (now {new}): {_where(text, m.start())}"
             for pat, new in DEPRECATED.items() for m in re.finditer(pat, text)]
    # several methods are score_methods'; score_trials scores one (method=)
    found += [f"score_trials(..., methods=) (now score_methods): {_where(text, at)}"
              for at, args in _calls(text, "score_trials") if re.search(r"\bmethods\s*=", args)]
    assert not found, "\n".join(found)


def _md_names() -> set[str]:
    skip = {".venv", ".git", "site", "build", "node_modules"}
    return {p.name for p in REPO.rglob("*.md") if not skip & set(p.relative_to(REPO).parts)}


MD_NAMES = _md_names()


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_links_and_file_references_exist(path):
    """Every relative Markdown link resolves (from the file's folder), and every
    ``.md`` file named in the text exists (by path, or by name for a bare name)."""
    text = _text(path)
    here = path.parent
    bad = []
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1).split("#")[0].split("?")[0]
        if not target or re.match(r"[a-z]+:", target):  # an anchor, http:, mailto:
            continue
        if not (here / target).exists():
            bad.append(f"link {m.group(1)}: {_where(text, m.start())}")
    for m in re.finditer(r"(?<![\w/.<>-])((?:[\w.-]+/)*[\w-]+\.md)\b", text):
        ref = m.group(1)
        if "/" in ref:
            ok = any((base / ref).exists() for base in (here, REPO, REPO / "docs"))
        else:
            ok = ref in MD_NAMES
        if not ok:
            bad.append(f"file {ref}: {_where(text, m.start())}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_cri_direction_is_clean_into_corrupted(path):
    """CRI patches the clean run's output into the corrupted run, never the reverse."""
    text = " ".join(_text(path).split())
    reverse = re.findall(r"[^.]*into the clean run[^.]*", text, flags=re.I)
    assert not reverse, reverse


@pytest.mark.parametrize("place", CRI_PLACES)
def test_cri_is_described_in_one_wording(place):
    found = CRI_WORDING in " ".join((REPO / place).read_text().split())
    assert found, f"{place} does not describe CRI as: {CRI_WORDING}"


@pytest.mark.parametrize("place", TORCH_PLACES)
def test_one_torch_install_line(place):
    found = TORCH_LINE in (REPO / place).read_text()
    assert found, f"{place} lacks the torch install line: {TORCH_LINE}"


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_notebooks_are_not_counted(path):
    """The notebooks are listed, not counted: a count goes stale when one is added."""
    text = _text(path)
    found = re.findall(r"\b(?:\d+|two|three|four|five|six|seven|eight|nine|ten) "
                       r"(?:worked examples|notebooks|example notebooks)\b", text, flags=re.I)
    assert not found, found
