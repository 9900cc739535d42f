"""``locos build-trials``: write NoLiMa / NIAH trial files for ``locos score --trials``, and
the specificity-control trials (parametric, arithmetic, organism echo) for
``locos ablate --control``."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from locos_tl.cli import HelpGroup, app
from locos_tl.cli._common import check_out_file, fail
from locos_tl.errors import LocosError

build_app = typer.Typer(
    name="build-trials",
    cls=HelpGroup,
    help="Build retrieval trials (exact prompt lengths and needle spans) as JSON lines.",
    no_args_is_help=True,
)
app.add_typer(build_app, name="build-trials",
              short_help="Build retrieval trial files (JSON lines) for `locos score`.")

HaystackOpt = Annotated[
    list[Path] | None,
    typer.Option("--haystack", help="Book text file (repeat for several, or give a folder; "
                                    "default: the public-domain books shipped with locos_tl).",
                 exists=True),
]
TokenizerOpt = Annotated[
    str, typer.Option(help="Local folder with tokenizer files, a hub model name, a .gguf "
                           "file or a model from `locos models list`.")
]
LengthsOpt = Annotated[
    str, typer.Option(help="Prompt lengths in tokens: '1000,2000' or 'linspace:1000:16000:5'.")
]
DepthsOpt = Annotated[
    str, typer.Option(help="Needle depths in percent: '0,50,100' or 'linspace:0:100:10'.")
]
NumOpt = Annotated[
    int | None,
    typer.Option(help="Sample this many trials, stratified by (entry, test, depth)."),
]
ChatOpt = Annotated[
    bool, typer.Option("--chat-template/--no-chat-template",
                       help="Render with the tokenizer's chat template (thinking disabled).")
]
SeedOpt = Annotated[int, typer.Option(help="Sampling seed.")]
OutOpt = Annotated[Path, typer.Option(help="Output trials file (JSON lines).",
                                      callback=lambda out: check_out_file(out))]


@build_app.command("nolima")
def nolima(
    needle_set: Annotated[str, typer.Option(
        help="NoLiMa needle_set*.json file, or the name of a set shipped with locos_tl: "
             "everyday, everyday_train, hop_train, hop_detect, hop_eval, hop_val "
             "(self-written; direct and onehop questions; what each is for: "
             "docs/elicited.md).")],
    tokenizer: TokenizerOpt,
    out: OutOpt,
    haystack: HaystackOpt = None,
    lengths: LengthsOpt = "1000,2000,3000,4000,5000",
    depths: DepthsOpt = "linspace:0:100:10",
    num_examples: NumOpt = None,
    question_type: Annotated[
        list[str] | None,
        typer.Option(help="Question type(s) to keep (repeatable), e.g. onehop; default all."),
    ] = None,
    characters_per_entry: Annotated[int, typer.Option(help="Names drawn per entry.")] = 1,
    chat_template: ChatOpt = False,
    template: Annotated[str, typer.Option(
        help="Task template: default (each entry's own, chat-style) or completion (ends "
             "'Answer: The character's name is', for base models; use with --no-chat-template)."
    )] = "default",
    distractors: Annotated[int, typer.Option(
        help="Distractor needles per trial: needles of other entries, each with another "
             "character, at random depths (chance 1/(N+1) among the names).", min=0)] = 0,
    seed: SeedOpt = 0,
) -> None:
    """NoLiMa trials (Modarressi et al. 2025, arXiv 2502.05167) from a needle set."""
    from locos_tl.data import (
        build_nolima_trials,
        expand_needle_set,
        load_needle_set,
        parse_depths,
        parse_lengths,
    )
    from locos_tl.data.nolima import TASK_TEMPLATES

    if template not in TASK_TEMPLATES:
        fail(LocosError(f"unknown --template {template!r}; use one of "
                        f"{', '.join(TASK_TEMPLATES)}"))
    try:
        items = expand_needle_set(load_needle_set(needle_set), question_type or None)
        tok, hays = _tokenizer(tokenizer), _haystacks(haystack)
        t0 = time.perf_counter()
        trials = build_nolima_trials(
            tok, items, hays, lengths=parse_lengths(lengths), depths=parse_depths(depths),
            num_examples=num_examples, characters_per_entry=characters_per_entry,
            chat_template=chat_template, seed=seed, template=template,
            distractors=distractors,
        )
    except LocosError as exc:
        fail(exc)
    _write(trials, out, "nolima", time.perf_counter() - t0, dict(
        needle_set=str(needle_set), haystacks=_sources(haystack), tokenizer=tokenizer,
        lengths=lengths, depths=depths, num_examples=num_examples, question_type=question_type,
        characters_per_entry=characters_per_entry, chat_template=chat_template,
        template=template, distractors=distractors, seed=seed,
    ))


@build_app.command("niah")
def niah(
    tokenizer: TokenizerOpt,
    out: OutOpt,
    needles: Annotated[Path | None, typer.Option(
        help="NIAH probes (JSON lines: needle, question, real_needle; default: the Wu et al. "
             "probes shipped with locos_tl).", exists=True, dir_okay=False)] = None,
    haystack: HaystackOpt = None,
    lengths: LengthsOpt = "1000,2000,3000,4000,5000",
    depths: DepthsOpt = "linspace:0:100:10",
    num_examples: NumOpt = None,
    chat_template: ChatOpt = False,
    seed: SeedOpt = 0,
) -> None:
    """Literal NIAH trials (Wu et al. 2025, arXiv 2404.15574): needle span = the whole
    needle (read by LOCOS, attention-spatial, DLA), answer span = its real_needle part
    (read by the Wu copy score and HeadKV)."""
    from locos_tl.data import build_niah_trials, load_niah_probes, parse_depths, parse_lengths
    from locos_tl.data.packaged import niah_probes_path

    try:
        probes = load_niah_probes(needles or niah_probes_path())
        tok, hays = _tokenizer(tokenizer), _haystacks(haystack)
        t0 = time.perf_counter()
        trials = build_niah_trials(
            tok, probes, hays, lengths=parse_lengths(lengths), depths=parse_depths(depths),
            num_examples=num_examples, chat_template=chat_template, seed=seed,
        )
    except LocosError as exc:
        fail(exc)
    _write(trials, out, "niah", time.perf_counter() - t0, dict(
        needles=str(needles) if needles else "locos_tl:niah/niah_needles.jsonl",
        haystacks=_sources(haystack), tokenizer=tokenizer,
        lengths=lengths, depths=depths, num_examples=num_examples,
        chat_template=chat_template, seed=seed,
    ))


ControlTemplateOpt = Annotated[
    str, typer.Option(help="Prompt text with one {question} slot (a literal \\n is a "
                           "newline).")
]


def _control_template(text: str) -> str:
    return text.replace("\\n", "\n")


@build_app.command("parametric")
def parametric(
    tokenizer: TokenizerOpt,
    out: OutOpt,
    num_examples: Annotated[int | None, typer.Option(
        help="Sample this many questions; default: all shipped facts of --kind.")] = None,
    kind: Annotated[list[str] | None, typer.Option(
        help="city_country and/or entity (repeatable); default both.")] = None,
    template: ControlTemplateOpt = "Question: {question}\\nAnswer:",
    chat_template: ChatOpt = False,
    seed: SeedOpt = 0,
) -> None:
    """Parametric-knowledge control trials (city -> country, popular-entity facts; arXiv
    2607.01002, Sec. 4) from the facts shipped with locos_tl, for `locos ablate --control`."""
    from locos_tl.data.controls import PARAMETRIC_KINDS, build_parametric_trials

    try:
        tok = _tokenizer(tokenizer)
        t0 = time.perf_counter()
        trials = build_parametric_trials(
            tok, n=num_examples, kinds=tuple(kind or PARAMETRIC_KINDS), seed=seed,
            template=_control_template(template), chat_template=chat_template)
    except (LocosError, ValueError) as exc:
        fail(exc)
    _write(trials, out, "parametric", time.perf_counter() - t0, dict(
        tokenizer=tokenizer, num_examples=num_examples, kind=kind, template=template,
        chat_template=chat_template, seed=seed))


@build_app.command("arithmetic")
def arithmetic(
    tokenizer: TokenizerOpt,
    out: OutOpt,
    num_examples: Annotated[int, typer.Option(help="Number of distinct questions.")] = 50,
    ops: Annotated[str, typer.Option(help="Operators, comma-separated: +,-,*")] = "+,-,*",
    template: ControlTemplateOpt = "Question: {question}\\nAnswer:",
    chat_template: ChatOpt = False,
    seed: SeedOpt = 0,
) -> None:
    """1-digit arithmetic control trials ("What is 3 + 4?" -> "7"; arXiv 2607.01002,
    Sec. 4), drawn with a seed, for `locos ablate --control`."""
    from locos_tl.data.controls import build_arithmetic_trials

    try:
        tok = _tokenizer(tokenizer)
        t0 = time.perf_counter()
        trials = build_arithmetic_trials(
            tok, n=num_examples, ops=[o.strip() for o in ops.split(",") if o.strip()],
            seed=seed, template=_control_template(template), chat_template=chat_template)
    except (LocosError, ValueError) as exc:
        fail(exc)
    _write(trials, out, "arithmetic", time.perf_counter() - t0, dict(
        tokenizer=tokenizer, num_examples=num_examples, ops=ops, template=template,
        chat_template=chat_template, seed=seed))


@build_app.command("organism")
def organism(
    out: OutOpt,
    task: Annotated[str, typer.Option(help="literal (NIAH-like) or nonliteral "
                                           "(NoLiMa-like).")] = "nonliteral",
    n: Annotated[int, typer.Option(help="Number of trials.", min=1)] = 40,
    length: Annotated[int, typer.Option(help="Prompt length in tokens (valid range: "
                                             "retrieval-long 512-2048, retrieval-2l up to "
                                             "128); with 8 answer tokens it must fit the "
                                             "organism's context.", min=16)] = 1024,
    book: Annotated[Path | None, typer.Option(
        help="Book text file or folder used as filler (default: synthetic filler).",
        exists=True)] = None,
    model: Annotated[str | None, typer.Option(
        help="The organism the trials are for (shipped name or directory; default: "
             "retrieval-long): --length is checked against its context.")] = None,
    seed: SeedOpt = 12345,
) -> None:
    """The model organisms' literal or non-literal retrieval trials (needle span = the
    `NAME LANDMARK` pair; `meta.query_start` = the question, for `locos compress`)."""
    from locos_tl.cli._common import check_length
    from locos_tl.cli.demo import MAX_NEW_TOKENS, resolve_organism, valid_length_warning
    from locos_tl.organisms import TASKS, make_trials

    if task not in TASKS:
        fail(LocosError(f"unknown --task {task!r}; use {' or '.join(TASKS)}"))
    try:
        organism_dir = resolve_organism(model)
        if not (organism_dir / "config.json").is_file():
            raise LocosError(f"--model {model}: no organism at {organism_dir} (no "
                             "config.json); shipped: retrieval-long, retrieval-2l")
        check_length(str(organism_dir), [length], MAX_NEW_TOKENS)  # before any work
        warn = valid_length_warning(organism_dir, (length,))
        if warn:
            typer.secho(warn, err=True, fg=typer.colors.YELLOW)
        t0 = time.perf_counter()
        trials = make_trials(task, n, length, seed=seed, book=book)  # type: ignore[arg-type]
    except (LocosError, ValueError, FileNotFoundError) as exc:
        fail(exc)
    _write(trials, out, f"organism-{task}", time.perf_counter() - t0, dict(
        task=task, n=n, length=length, book=str(book) if book else None,
        model=organism_dir.name, seed=seed))


@build_app.command("organism-echo")
def organism_echo(
    out: OutOpt,
    num_examples: Annotated[int, typer.Option(help="Number of distinct words.")] = 50,
    top: Annotated[int, typer.Option(help="Draw from this many most frequent filler "
                                          "words.")] = 100,
    seed: SeedOpt = 0,
) -> None:
    """The model organism's context-free control: the prompt `<s> w` answered with `w`
    (the organism knows no fact it can state without a context). Score it with
    `locos ablate --control FILE --control-max-new-tokens 1`."""
    from locos_tl.organisms.controls import make_echo_trials

    try:
        t0 = time.perf_counter()
        trials = make_echo_trials(num_examples, seed=seed, top=top)
    except (LocosError, ValueError) as exc:
        fail(exc)
    _write(trials, out, "organism-echo", time.perf_counter() - t0, dict(
        num_examples=num_examples, top=top, seed=seed))


def _tokenizer(name: str) -> Any:
    from locos_tl.data.hub import load_tokenizer

    return load_tokenizer(name)


def _sources(paths: Sequence[Path] | None) -> list[str]:
    """The haystacks as recorded in a trials file's provenance (no machine paths for the
    shipped books)."""
    return [str(p) for p in paths] if paths else ["locos_tl:books"]


def _haystacks(paths: Sequence[Path] | None) -> list[Any]:
    from locos_tl.data import load_haystacks
    from locos_tl.data.packaged import book_dir

    files: list[Path] = []
    for p in paths or [book_dir()]:
        files.extend(sorted(p.glob("*.txt")) if p.is_dir() else [p])
    return load_haystacks(files)


def _write(trials: list[Any], out: Path, task: str, seconds: float, args: dict[str, Any]) -> None:
    import locos_tl
    from locos_tl.trials import save_trials, trial_set_hash

    save_trials(trials, out)
    meta = dict(task=task, n_trials=len(trials), trial_set_hash=trial_set_hash(trials),
                locos_tl_version=getattr(locos_tl, "__version__", "unknown"), args=args)
    Path(str(out) + ".meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    typer.echo(f"wrote {len(trials)} {task} trials to {out} in {seconds:.1f} s "
               f"(set hash {meta['trial_set_hash']})")
