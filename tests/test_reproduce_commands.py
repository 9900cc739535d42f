"""One command per published result: every result folder under ``docs/real_models`` holds
a ``COMMAND`` file with the commands that made its tables, every command names a script
or ``locos`` command with options its own parser accepts (parsed, not run),
``docs/reproduce.md`` lists every folder, and the tables that rebuild from published files
alone in seconds are rebuilt through their listed commands and equal the published ones.

A ``COMMAND`` file: ``#`` lines are comments, a line ending in a backslash goes on, every
other line is one command (shell words)."""

from __future__ import annotations

import argparse
import itertools
import json
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "docs" / "real_models"
REPRODUCE_PAGE = REPO / "docs" / "reproduce.md"
#: the folders a ``locos reproduce`` run's own stages write (``ablate/<cell>``,
#: ``heads/<method>``, ``compress``, ``patch``): the run's ``COMMAND`` covers them
STAGE_FOLDERS = ("ablate", "heads", "compress", "patch")
#: options whose values are rankings of the method registry
RANKING_OPTIONS = ("--methods", "--more-methods")
#: scripts whose tables rebuild from published files alone, without a model, in seconds
FROM_PUBLISHED_FILES = ("experiments/head_overlap.py",)


def read_commands(path: Path) -> list[list[str]]:
    """The commands of a ``COMMAND`` file, each as its shell words."""
    text = "\n".join(line for line in path.read_text().splitlines()
                     if not line.lstrip().startswith("#"))
    return [shlex.split(line) for line in text.replace("\\\n", " ").splitlines()
            if line.strip()]


COMMAND_FILES = sorted(PUBLISHED.rglob("COMMAND"))
COMMANDS = [pytest.param(argv, id=f"{path.parent.relative_to(PUBLISHED)}:{i}")
            for path in COMMAND_FILES for i, argv in enumerate(read_commands(path))]


def _stage_folder_of_a_run(folder: Path) -> bool:
    """``folder`` is written by the stages of a run whose folder records its command."""
    for run in folder.parents:
        if run == PUBLISHED:
            return False
        if (run / "args.json").exists() and (run / "COMMAND").exists():
            return folder.relative_to(run).parts[0] in STAGE_FOLDERS
    return False


def test_every_published_result_folder_records_its_commands():
    folders = sorted({p.parent for p in PUBLISHED.rglob("*.csv")})
    assert len(folders) > 40
    missing = [str(f.relative_to(REPO)) for f in folders
               if not (f / "COMMAND").exists() and not _stage_folder_of_a_run(f)]
    assert not missing, "result folders without a COMMAND file: " + ", ".join(missing)
    empty = [str(p.relative_to(REPO)) for p in COMMAND_FILES if not read_commands(p)]
    assert not empty, "COMMAND files without a command: " + ", ".join(empty)
    # every run of the protocol records its command too (its args.json holds only the
    # options of its last call)
    runs = [p.parent for p in PUBLISHED.rglob("args.json")]
    assert len(runs) == 9
    assert all((run / "COMMAND").exists() for run in runs)


def test_reproduce_page_lists_every_command_file():
    page = REPRODUCE_PAGE.read_text()
    listed = {folder or "." for folder in
              re.findall(r"\]\(real_models/(?:([^)]*)/)?COMMAND\)", page)}
    want = {str(p.parent.relative_to(PUBLISHED)) for p in COMMAND_FILES}
    assert listed == want, (sorted(want - listed), sorted(listed - want))


class _Parsed(Exception):
    """Raised in place of running a script once its parser has read the arguments."""


def _check_script(script: Path, args: list[str], monkeypatch) -> argparse.Namespace:
    """Run ``script``'s ``main()`` until its argument parser has parsed ``args``: a
    wrong option or value stops it there (``SystemExit``), as it would the command."""
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, argv=None, namespace=None):
        raise _Parsed(real(self, argv, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.syspath_prepend(str(script.parent))  # scripts import their neighbours
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    main = runpy.run_path(str(script), run_name="parse_only")["main"]
    with pytest.raises(_Parsed) as parsed:
        main()
    return parsed.value.args[0]


def _check_locos(args: list[str]) -> None:
    """Parse ``locos ARGS`` with the command line's own parser, without running it."""
    import typer
    import typer.core

    from locos_tl.cli import app

    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("locos", [], resilient_parsing=True)
    rest = list(args)
    while isinstance(cmd, typer.core.TyperGroup):
        name = rest.pop(0)
        sub = cmd.get_command(ctx, name)
        assert sub is not None, f"locos has no command {name!r}"
        cmd = sub
        if isinstance(cmd, typer.core.TyperGroup):
            ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
    if name == "reproduce":
        _reproduce_options(rest)  # its options, and the values its configuration refuses
    else:
        cmd.make_context(name, rest, parent=ctx)


def _reproduce_options(argv: list[str]) -> dict:
    """The options ``locos reproduce ARGV`` would run with, by name (as ``args.json``
    records them), read by the command's own parser without running it."""
    from locos_tl.cli.reproduce import parse_config

    return parse_config(argv).settings()


@pytest.mark.parametrize("argv", COMMANDS)
def test_every_recorded_command_parses(argv, monkeypatch):
    from locos_tl.experiments.protocol.common import RANKINGS

    program, *args = argv
    if program == "locos":
        _check_locos(args)
    elif program == "python":
        script = REPO / args[0]
        assert script.parent.name in ("experiments", "benchmarks") and script.is_file(), \
            f"no script {args[0]}"
        _check_script(script, args[1:], monkeypatch)
    elif program == "bash":
        assert (REPO / args[0]).is_file() and args[0].startswith("scripts/"), args[0]
    else:
        pytest.fail(f"{program}: a command runs locos, python or bash")
    for option, value in itertools.pairwise(args):
        if option in RANKING_OPTIONS:
            unknown = set(value.split(",")) - {*RANKINGS, "baseline"}
            assert not unknown, f"{option} names unknown rankings {sorted(unknown)}"
        if option == "--pairs":
            unknown = {m for pair in value.split(",") for m in pair.split(":")} - set(RANKINGS)
            assert not unknown, f"--pairs names unknown rankings {sorted(unknown)}"
    paths = [a for a in args if a.startswith("docs/")]
    assert all((REPO / p).exists() for p in paths), [p for p in paths
                                                     if not (REPO / p).exists()]


def _published_file_commands() -> list:
    return [pytest.param(argv, id=argv[1]) for param in COMMANDS
            for argv in [param.values[0]] if argv[0] == "python"
            and argv[1] in FROM_PUBLISHED_FILES]


@pytest.mark.parametrize("argv", _published_file_commands())
def test_tables_rebuild_from_published_files_through_their_commands(argv, tmp_path,
                                                                    monkeypatch):
    """The listed command, run as listed with its output sent to a scratch file, writes
    the published table again. Same code on the same published scores: equal up to the
    order of float64 sums over at most 270 heads (Spearman over all heads; the
    hypergeometric p of an overlap is computed from integers)."""
    import numpy as np
    import pandas as pd

    script, *args = argv[1:]
    published = REPO / args[args.index("--out") + 1]
    args[args.index("--out") + 1] = str(tmp_path / published.name)
    monkeypatch.chdir(REPO)
    monkeypatch.syspath_prepend(str(REPO / Path(script).parent))
    monkeypatch.setattr(sys, "argv", [script, *args])
    runpy.run_path(str(REPO / script), run_name="__main__")
    got, want = pd.read_csv(tmp_path / published.name), pd.read_csv(published)
    assert list(got.columns) == list(want.columns) and len(got) == len(want) > 0
    floats = [c for c in want.columns if want[c].dtype == float]
    pd.testing.assert_frame_equal(got.drop(columns=floats), want.drop(columns=floats))
    tol = 270 * np.finfo(np.float64).eps
    np.testing.assert_allclose(got[floats].to_numpy(), want[floats].to_numpy(), rtol=tol,
                               atol=tol)


def test_a_protocol_command_records_the_published_options():
    """The generating ``locos reproduce`` command of a run gives the options its
    ``args.json`` recorded (Wu's ranking by its registered name), but the stages and
    the output folder."""
    from locos_tl.experiments.methods import current_name

    for path in COMMAND_FILES:
        if not (path.parent / "args.json").exists():
            continue
        recorded = json.loads((path.parent / "args.json").read_text())
        generating = [argv for argv in read_commands(path) if argv[:2] == [
            "locos", "reproduce"] and "--resume-from" not in argv]
        if not generating:
            continue
        parsed = _reproduce_options(generating[0][2:])
        for key in ("model", "template", "needle_set", "detect_needle_set", "eval_needle_set",
                    "distractors", "n_detect", "n_eval", "n_control", "eval_lengths", "ks",
                    "random_seeds", "control_ks", "control_seeds"):
            if key in recorded:  # the first runs predate some options
                assert parsed[key] == recorded[key], (path, key, parsed[key], recorded[key])
        assert parsed["methods"].split(",") == [current_name(m) for m in
                                                recorded["methods"].split(",")], path
