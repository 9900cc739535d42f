"""``locos elicit``: fine-tune a real model's MLPs (LoRA) on distractor trials, leaving its
attention pretrained (:mod:`locos_tl.organisms.elicit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from locos_tl.cli import app
from locos_tl.cli._common import fail
from locos_tl.errors import LocosError

_OUT = Path("data/organisms/smollm2-135m-nolima")


@app.command("elicit", short_help="Fine-tune a real model's MLPs to retrieve non-literally "
                                  "(attention stays pretrained).")
def elicit_command(
    base: Annotated[str, typer.Option(help="base model: zoo name, GGUF file or directory")
                    ] = "smollm2-135m-instruct",
    out: Annotated[Path, typer.Option(help="run directory (resumed when it holds a "
                                           "checkpoint)")] = _OUT,
    data_dir: Annotated[Path | None, typer.Option(
        help="folder with haystack/*.txt holding BOOK (default: the books shipped with "
             "locos_tl)")] = None,
    book: Annotated[str, typer.Option(help="training book: a shipped book's name, or a "
                                           "file in DATA_DIR/haystack (keep it apart from "
                                           "the evaluation books)")
                    ] = "dracula_part1",
    needle_set: Annotated[str, typer.Option(
        help="training needle set (never the evaluation set)")] = "everyday_train",
    steps: Annotated[int, typer.Option(help="optimizer steps, one trial each")] = 2400,
    lr: Annotated[float, typer.Option(help="peak learning rate")] = 2e-4,
    rank: Annotated[int, typer.Option(help="LoRA rank")] = 16,
    seed: Annotated[int, typer.Option(help="trials, order and initialisation")] = 0,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
) -> None:
    """Fine-tune only the MLP blocks of BASE (LoRA on gate/up/down projections) on NoLiMa
    trials of 500-1000 tokens with 1-3 distractor needles, from the training needle set on
    a training book. Deterministic and resumable (checkpoint every 25 steps); shows the
    loss and, every 400 steps, the held-out validation accuracy. Writes OUT/adapter,
    OUT/curve.jsonl and OUT/elicit.json. Needs the elicit extra (peft).
    """
    from locos_tl.organisms.elicit import ElicitConfig, elicit

    cfg = ElicitConfig(base=base, needle_set=needle_set,
                       haystacks=(book if data_dir is None
                                  else str(data_dir / "haystack" / book),),
                       steps=steps, lr=lr,
                       rank=rank, alpha=2 * rank, seed=seed)
    try:
        adapter = elicit(cfg, out, device=device,
                         log=lambda m: typer.secho(m, err=True, fg=typer.colors.CYAN))
    except LocosError as exc:
        fail(exc)
    typer.echo(f"adapter: {adapter}\nlearning curve: {out / 'curve.jsonl'}")
