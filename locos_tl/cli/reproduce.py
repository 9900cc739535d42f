"""``locos reproduce``: the paper's protocol on a real model, one resumable command
(:mod:`locos_tl.experiments.protocol`). Every option is a field of
:class:`~locos_tl.experiments.protocol.config.ProtocolConfig` and says so in its help
(:func:`~locos_tl.experiments.protocol.config.help_of`); the command builds the
configuration and runs it (:func:`~locos_tl.experiments.protocol.main.run_protocol`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from locos_tl.cli import app
from locos_tl.cli._common import ClickContext, fail, resumable
from locos_tl.errors import LocosError
from locos_tl.experiments.protocol.config import ProtocolConfig
from locos_tl.experiments.protocol.config import help_of as _h

D = ProtocolConfig  # the defaults: the dataclass's fields


@app.command(
    "reproduce",
    short_help="The paper's protocol on a real model: detection, ablation grid, controls, "
               "CRI, compression, report (resumable).",
)
def reproduce(
    ctx: ClickContext,
    model: Annotated[str, typer.Option(help=_h("model"))] = D.model,
    out: Annotated[str | None, typer.Option(help=_h("out"))] = None,
    preset: Annotated[str, typer.Option(help=_h("preset"))] = D.preset,
    needle_set: Annotated[str, typer.Option(help=_h("needle_set"))] = D.needle_set,
    detect_needle_set: Annotated[str | None, typer.Option(
        help=_h("detect_needle_set"))] = None,
    eval_needle_set: Annotated[str | None, typer.Option(help=_h("eval_needle_set"))] = None,
    template: Annotated[str, typer.Option(help=_h("template"))] = D.template,
    data_dir: Annotated[str | None, typer.Option(help=_h("data_dir"))] = None,
    stages: Annotated[str, typer.Option(help=_h("stages"))] = D.stages,
    detect_length: Annotated[int, typer.Option(help=_h("detect_length"))] = D.detect_length,
    detect_haystack: Annotated[str, typer.Option(
        help=_h("detect_haystack"))] = D.detect_haystack,
    distractors: Annotated[int, typer.Option(help=_h("distractors"))] = D.distractors,
    max_new_tokens: Annotated[int, typer.Option(
        help=_h("max_new_tokens"))] = D.max_new_tokens,
    eval_max_new_tokens: Annotated[int, typer.Option(
        help=_h("eval_max_new_tokens"))] = D.eval_max_new_tokens,
    niah_max_new_tokens: Annotated[int, typer.Option(
        help=_h("niah_max_new_tokens"))] = D.niah_max_new_tokens,
    control_ks: Annotated[str | None, typer.Option(help=_h("control_ks"))] = None,
    control_seeds: Annotated[str | None, typer.Option(help=_h("control_seeds"))] = None,
    n_calibration: Annotated[int, typer.Option(help=_h("n_calibration"))] = D.n_calibration,
    calibration_chars: Annotated[int, typer.Option(
        help=_h("calibration_chars"))] = D.calibration_chars,
    calibration_tokens: Annotated[int, typer.Option(
        help=_h("calibration_tokens"))] = D.calibration_tokens,
    batch_size: Annotated[int, typer.Option(help=_h("batch_size"))] = D.batch_size,
    workers: Annotated[int, typer.Option(help=_h("workers"))] = D.workers,
    dtype: Annotated[str, typer.Option(help=_h("dtype"))] = D.dtype,
    device: Annotated[str | None, typer.Option(help=_h("device"))] = None,
    resume_from: Annotated[str | None, typer.Option(help=_h("resume_from"))] = None,
    publish: Annotated[str | None, typer.Option(help=_h("publish"))] = None,
    n_detect: Annotated[int | None, typer.Option(help=_h("n_detect"))] = None,
    n_eval: Annotated[int | None, typer.Option(help=_h("n_eval"))] = None,
    n_niah: Annotated[int | None, typer.Option(help=_h("n_niah"))] = None,
    n_control: Annotated[int | None, typer.Option(help=_h("n_control"))] = None,
    n_cri: Annotated[int | None, typer.Option(help=_h("n_cri"))] = None,
    n_compress: Annotated[int | None, typer.Option(help=_h("n_compress"))] = None,
    eval_lengths: Annotated[str | None, typer.Option(help=_h("eval_lengths"))] = None,
    random_seeds: Annotated[str | None, typer.Option(help=_h("random_seeds"))] = None,
    methods: Annotated[str | None, typer.Option(help=_h("methods"))] = None,
    fractions: Annotated[str | None, typer.Option(help=_h("fractions"))] = None,
    ks: Annotated[str | None, typer.Option(help=_h("ks"))] = None,
    questions: Annotated[str | None, typer.Option(help=_h("questions"))] = None,
) -> None:
    """Run the paper's protocol: trials, detect, calibrate, ablate, patch, compress,
    report (--stages), resumable: a rerun skips or finishes each stage. The sizes and
    grids left unset are the --preset's (cpu: this repository's published runs; full:
    the paper's)."""
    from locos_tl.experiments.protocol.main import run_protocol

    try:
        config = config_of(ctx.params)
        with resumable(Path(str(config.out)), ctx):
            run_protocol(config)
    except (LocosError, FileNotFoundError) as exc:
        fail(exc)


def config_of(params: dict[str, Any]) -> ProtocolConfig:
    """The :class:`ProtocolConfig` of ``locos reproduce``'s parsed options (``params``,
    by field name; None: the field's default).

    Raises:
        ConfigError: as :class:`ProtocolConfig`.
    """
    return ProtocolConfig.from_kwargs(where="locos reproduce", **params)


def parse_config(argv: Sequence[str]) -> ProtocolConfig:
    """The :class:`ProtocolConfig` that ``locos reproduce <argv>`` would run, parsed by the
    command itself (its options, types and defaults), without running it.

    Raises:
        click.UsageError: an unknown option or a value of the wrong type.
        ConfigError: as :class:`ProtocolConfig`.
    """
    command = typer.main.get_command(app).get_command(None, "reproduce")  # type: ignore[union-attr]
    ctx = command.make_context("reproduce", list(argv))
    return config_of(ctx.params)
