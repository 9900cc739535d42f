"""The recipe scripts rebuild the shipped adapters' training configurations: the flags of
``scripts/elicit_hop.sh`` and ``scripts/elicit_hop_gemma.sh``, passed through ``locos
elicit``'s own parser, give the ``config`` each adapter's ``elicit.json`` records."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from locos_tl.organisms.elicit import PREDATING

REPO = Path(__file__).resolve().parents[1]
ORGANISMS = REPO / "data" / "organisms"



def _script_argv(script: str, **values: str) -> list[str]:
    """The ``locos elicit`` arguments of a recipe script, its shell variables filled in."""
    text = (REPO / "scripts" / script).read_text()
    command = text[text.index("exec locos elicit"):].replace("\\\n", " ").splitlines()[0]
    for name, value in values.items():
        command = command.replace(f'"${name}"', value)
    assert "$" not in command, command
    return shlex.split(command)[3:]


def _config(argv: list[str], monkeypatch) -> dict:
    """The :class:`~locos_tl.organisms.elicit.ElicitConfig` that ``locos elicit argv``
    builds (training itself replaced by a stub that records it)."""
    import locos_tl.organisms.elicit as elicit_module
    from locos_tl.cli import app

    seen = {}

    def fake(cfg, out, **_):
        seen["cfg"] = cfg
        return out / "adapter"

    monkeypatch.setattr(elicit_module, "elicit", fake)
    res = CliRunner().invoke(app, ["elicit", *argv])
    assert res.exit_code == 0, res.output
    return json.loads(json.dumps(asdict(seen["cfg"])))


@pytest.mark.parametrize(("script", "values", "shipped"), [
    ("elicit_hop.sh", {"out": "OUT", "base": "smollm2-135m-instruct"}, "smollm2-135m-nolima"),
    ("elicit_hop.sh", {"out": "OUT", "base": "gemma-3-270m"}, "gemma3-270m-nolima-v1"),
    ("elicit_hop_gemma.sh", {"out": "OUT", "weight": "0.3"}, "gemma3-270m-nolima"),
])
def test_recipe_script_rebuilds_the_shipped_config(script, values, shipped, monkeypatch,
                                                   tmp_path):
    """Every recorded setting but the prompt form (``auto`` resolves to the base's form
    at training time) equals the script's; a setting the record predates had its old
    behaviour."""
    monkeypatch.chdir(tmp_path)
    cfg = _config(_script_argv(script, **values), monkeypatch)
    record = json.loads((ORGANISMS / shipped / "elicit.json").read_text())["config"]
    assert cfg["template"] == "auto"
    for key, value in cfg.items():
        if key == "template":
            continue
        want = record.get(key, PREDATING.get(key, value))
        assert value == want, (shipped, key, value, want)
    assert cfg["kl_weight"] == record["kl_weight"] and cfg["base"] == record["base"]


def test_gemma_script_default_weight_is_the_shipped_one():
    """Run without a weight, the Gemma script trains at the shipped adapter's KL weight."""
    text = (REPO / "scripts" / "elicit_hop_gemma.sh").read_text()
    shipped = json.loads((ORGANISMS / "gemma3-270m-nolima" / "elicit.json").read_text())
    assert f'weight="${{2:-{shipped["config"]["kl_weight"]}}}"' in text


def test_float32_training_is_an_option_of_its_own(monkeypatch, tmp_path):
    """``--no-bf16-autocast`` trains in float32 and changes nothing else; the default is
    the shipped recipes' bfloat16 autocast."""
    monkeypatch.chdir(tmp_path)
    argv = _script_argv("elicit_hop.sh", out="OUT", base="smollm2-135m-instruct")
    plain = _config(argv, monkeypatch)
    fp32 = _config([*argv, "--no-bf16-autocast"], monkeypatch)
    assert plain["bf16_autocast"] is True and fp32["bf16_autocast"] is False
    assert {k: v for k, v in fp32.items() if k != "bf16_autocast"} == \
        {k: v for k, v in plain.items() if k != "bf16_autocast"}
