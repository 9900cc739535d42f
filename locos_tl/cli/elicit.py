"""``locos elicit``: fine-tune a real model's MLPs (LoRA) on distractor trials, leaving its
attention pretrained (:mod:`locos_tl.organisms.elicit`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from locos_tl.cli import app
from locos_tl.cli._common import fail
from locos_tl.errors import LocosError

_RUNS = Path("runs/elicit")


@app.command("elicit", short_help="Fine-tune a real model's MLPs to retrieve non-literally "
                                  "(attention stays pretrained).")
def elicit_command(
    base: Annotated[str, typer.Option(help="base model: zoo name, GGUF file or directory")
                    ] = "smollm2-135m-instruct",
    out: Annotated[Path | None, typer.Option(
        help="run directory, resumed when it holds a checkpoint [default: "
             "runs/elicit/BASE]")] = None,
    data_dir: Annotated[Path | None, typer.Option(
        help="folder with haystack/*.txt holding BOOK (default: the books shipped with "
             "locos_tl)")] = None,
    book: Annotated[list[str] | None, typer.Option(
        help="training book, repeatable: a shipped book's name (or everyday_prose), or a "
             "file in DATA_DIR/haystack; keep them apart from the evaluation books "
             "[default: dracula_part1, everyday_prose]")] = None,
    val_book: Annotated[list[str] | None, typer.Option(
        help="book never trained on whose perplexity decides which states may be kept, "
             "repeatable, as BOOK [default: the training books' last tenth]")] = None,
    needle_set: Annotated[str, typer.Option(
        help="training needle set (never the evaluation set)")] = "hop_train",
    val_needle_set: Annotated[str | None, typer.Option(
        help="needle set of link kinds never trained on that validates (hop_val) "
             "[default: entries held out of the training set]")] = None,
    steps: Annotated[int, typer.Option(help="most optimizer steps, one trial each")] = 1200,
    lr: Annotated[float, typer.Option(help="peak learning rate")] = 2e-4,
    trainable: Annotated[str, typer.Option(
        help="lora (LoRA on the MLP projections; shippable) or mlp (every MLP weight)")
                         ] = "lora",
    rank: Annotated[int, typer.Option(help="LoRA rank (alpha = 2 x rank)")] = 32,
    template: Annotated[str, typer.Option(
        help="prompt form: chat, completion (base models: the answer follows \"The "
             "character's name is\") or auto (chat when the tokenizer has a chat "
             "template)")] = "auto",
    kl_weight: Annotated[float, typer.Option(
        help="weight of the KL term to the frozen base on book text and non-retrieval "
             "prompts (0: off)")] = 1.0,
    text_bos: Annotated[bool, typer.Option(
        help="start the KL term's and validation's book windows with the BOS token "
             "(--no-text-bos: the recipe of smollm2-135m-nolima and gemma3-270m-nolima-v1)")
    ] = True,
    bf16_autocast: Annotated[bool, typer.Option(
        help="train under bfloat16 autocast (the weights and optimizer stay float32); "
             "--no-bf16-autocast trains in float32, faster on a CPU without AMX "
             "(benchmarks/elicit_step_speed.py)")] = True,
    val_every: Annotated[int, typer.Option(
        help="steps between validations (and early-stopping checks)")] = 150,
    patience: Annotated[int, typer.Option(
        help="validations without a better score before stopping (0: never)")] = 3,
    seed: Annotated[int, typer.Option(help="trials, order and initialisation")] = 0,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
) -> None:
    """Fine-tune only the MLP blocks of BASE (LoRA on gate/up/down projections, or every
    MLP weight) on NoLiMa trials of 500-1000 tokens with 0-3 distractor needles, from the
    training needle set on the training books, plus a KL term to the frozen base on the
    books' text and on non-retrieval prompts the base answers itself. Deterministic and
    resumable (checkpoint every 25 steps); shows the loss and, every 150 steps, the
    validation entries' accuracy and the held-out KL and perplexity; keeps the best
    validation state and stops early. Writes OUT/adapter, OUT/curve.jsonl and
    OUT/elicit.json. Needs the elicit extra (peft).
    """
    from locos_tl.organisms.elicit import ElicitConfig, elicit

    out = out or _RUNS / Path(base).name
    books, val_books = tuple(book or ElicitConfig.haystacks), tuple(val_book or ())
    if data_dir is not None:
        books, val_books = (tuple(str(data_dir / "haystack" / b) for b in bs)
                            for bs in (books, val_books))
    cfg = ElicitConfig(base=base, needle_set=needle_set, val_needle_set=val_needle_set or "",
                       haystacks=books, val_books=val_books,
                       steps=steps, lr=lr, trainable=trainable, kl_weight=kl_weight,
                       patience=patience, val_every=val_every, rank=rank, alpha=2 * rank,
                       template=template, seed=seed, text_bos=text_bos,
                       bf16_autocast=bf16_autocast)
    try:
        adapter = elicit(cfg, out, device=device,
                         log=lambda m: typer.secho(m, err=True, fg=typer.colors.CYAN))
    except LocosError as exc:
        fail(exc)
    typer.echo(f"adapter: {adapter}\nlearning curve: {out / 'curve.jsonl'}")
