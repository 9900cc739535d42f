"""The command line starts without torch, TransformerLens or plotly; its help is complete
at 80 columns and lists the commands in workflow order; `import locos_tl` is lazy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import typer.main
from typer.testing import CliRunner

HEAVY = ("torch", "transformer_lens", "plotly", "transformers", "pandas")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=env)


def test_import_locos_tl_imports_no_heavy_module():
    res = _run("import json, sys, locos_tl\n"
               f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == []


HELP_ARGS = [[], ["build-trials"], ["build-trials", "nolima"], ["build-trials", "niah"],
             ["score"], ["ablate"], ["ablate-tf"], ["patch"], ["compress"], ["calibrate"], ["demo"],
             ["reproduce"], ["train-organism"], ["models"], ["models", "list"],
             ["models", "fetch"]]


def test_every_help_imports_no_heavy_module():
    """`locos ... --help` through the console-script entry point, in a fresh process."""
    code = (
        "import json, sys\n"
        "from locos_tl.cli import app\n"
        "texts = []\n"
        f"for args in {HELP_ARGS!r}:\n"
        "    sys.argv = ['locos', *args, '--help']\n"
        "    try:\n"
        "        app()\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (args, e.code)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    res = _run(code)
    assert res.returncode == 0, res.stderr
    *helps, last = res.stdout.rstrip("\n").split("\n")
    assert json.loads(last) == []
    text = "\n".join(helps)
    for args in HELP_ARGS:  # each help was printed
        assert f"Usage: locos {' '.join(args)}".rstrip() in text, args


def test_lazy_exports_resolve_to_the_defining_objects():
    import locos_tl

    for name, (module, attr) in locos_tl._EXPORTS.items():
        mod = sys.modules.get(module) or __import__(module, fromlist=["_"])
        expected = mod if attr is None else getattr(mod, attr)
        assert getattr(locos_tl, name) is expected, name
    assert set(locos_tl.__all__) == set(locos_tl._EXPORTS)
    assert set(locos_tl.__all__) <= set(dir(locos_tl))
    # the function lives in a package below the root: importing its module does not
    # shadow the public name
    import locos_tl.experiments.evaluate  # noqa: F401

    assert locos_tl.ablation_sweep is sys.modules["locos_tl.experiments.evaluate"].ablation_sweep
    assert callable(locos_tl.plot.head_heatmap)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        locos_tl.nope  # noqa: B018


def test_commands_listed_in_workflow_order():
    from locos_tl.cli import WORKFLOW_ORDER, app

    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    listed = re.findall(r"^  ([a-z][a-z-]+)  ", res.output.split("Commands:")[1], flags=re.M)
    assert listed == list(WORKFLOW_ORDER)


def _commands(group, path: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):  # a group (click's, or the one typer vendors)
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


def test_help_keeps_every_option_and_default_at_80_columns():
    from locos_tl.cli import app

    root = typer.main.get_command(app)
    commands = list(_commands(root))
    assert len(commands) >= 9
    for path, cmd in commands:
        res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
        assert res.exit_code == 0, (path, res.output)
        text = res.output
        assert max(len(line) for line in text.splitlines()) <= 80, path
        assert not re.search(r"(\.\.\.|…)$", text, re.M), path  # no text cut short
        squeezed = re.sub(r"\s+", "", text)
        for p in cmd.params:
            if p.param_type_name != "option" or p.hidden:  # hidden: deprecated spellings
                continue
            for opt in (*p.opts, *p.secondary_opts):  # names in full, never cut
                assert re.search(rf"(^|[\s,/]){re.escape(opt)}([\s,]|$)", text, re.M), \
                    (path, opt)
            if p.default in (None, [], False) or not p.show_default:
                continue  # nothing shown (a plain --flag defaults to off)
            if p.is_flag and p.secondary_opts:
                shown = (p.opts if p.default else p.secondary_opts)[0].lstrip("-")
            else:
                shown = str(p.default)
            shown = re.escape(re.sub(r"\s+", "", shown))
            assert re.search(rf"\[default:{shown}[;\]]", squeezed), (path, p.name, shown)


def test_needle_set_help_names_every_shipped_set():
    from locos_tl.cli import app
    from locos_tl.data.nolima import shipped_needle_sets

    res = CliRunner().invoke(app, ["build-trials", "nolima", "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    squeezed = re.sub(r"[\s│|]+", " ", res.output)
    assert len(shipped_needle_sets()) >= 5
    for name in shipped_needle_sets():
        assert re.search(rf"\b{name}\b", squeezed), name
