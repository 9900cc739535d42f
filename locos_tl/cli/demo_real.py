"""``locos demo --model NAME`` on a real pretrained LLM (``locos models list``).

The organism demo (:mod:`locos_tl.cli.demo`) compares LOCOS with a planted ground truth;
a real model has none, so this demo contrasts the two ways of asking for the same
needle instead. It builds a few trials from the shipped ``everyday`` needle set
(:mod:`locos_tl.data.needle_sets`) in a haystack that ships with locos_tl
(``data/haystacks/everyday_prose.txt``, self-written plain prose with no named people;
``--book FILE`` for another), asks each needle

- ``direct`` (literal: the question repeats the needle's words), and
- ``onehop`` (non-literal: no content word in common),

scores every head with LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002, Eq. 2-3)
and the Wu copy score (Wu et al. 2025, arXiv 2404.15574) in one decode pass per question
type, writes each run as ``locos score`` does (``direct/`` and ``onehop/``, heatmaps
included) and prints the top heads of both methods for literal and non-literal retrieval.

Instruct models get the chat template and the set's chat-style task template; a model
without a chat template (a base model such as ``gemma-3-270m``) gets the completion
template (:data:`locos_tl.data.nolima.COMPLETION_TASK_TEMPLATE`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locos_tl.data.haystack import PROSE_HAYSTACK as DEFAULT_HAYSTACK

#: Question types of the demo: (run directory, label).
QUESTION_TYPES = (("direct", "literal (direct)"), ("onehop", "non-literal (onehop)"))
#: Greedy budget: the answers are one short sentence ("The character who ... is Yuki.").
MAX_NEW_TOKENS = 24
#: Needle depths cycled over the trials (percent of the haystack).
DEPTHS = (20.0, 50.0, 80.0)
NEEDLE_SET = "everyday"
#: Default size: needles (each asked both ways) and prompt length in tokens; about
#: 1.5 minutes for SmolLM2-135M on a quiet 2-core CPU.
N_TRIALS, LENGTH = 8, 500


def is_real_model(name: str | None) -> bool:
    """True when ``name`` is a known real model (``locos models list``)."""
    from locos_tl.models.zoo import REAL_MODELS

    return name is not None and name in REAL_MODELS


def pick_items(n: int, seed: int = 0) -> dict[str, list[Any]]:
    """``n`` (entry, test) pairs of the everyday set, seeded, each asked both ways.

    Returns:
        ``{"direct": [NoLiMaItem, ...], "onehop": [...]}``, the same needles in the same
        order under both keys.

    Raises:
        DataFormatError: ``n`` is not in ``1..(entries x tests)``.
    """
    from locos_tl.data import expand_needle_set, load_needle_set
    from locos_tl.errors import DataFormatError

    entries = load_needle_set(NEEDLE_SET)
    pairs = [(e.id, t) for e in entries for t in e.tests]
    if not 1 <= n <= len(pairs):
        raise DataFormatError(f"--n-trials {n}: the {NEEDLE_SET} set has {len(pairs)} "
                              "needles (entry x test)")
    rng = random.Random(seed)
    by_entry: dict[str, list[str]] = {}
    for eid, tid in pairs:
        by_entry.setdefault(eid, []).append(tid)
    order = list(by_entry)
    rng.shuffle(order)
    chosen = []  # one test per entry first, so small demos cover different needles
    while len(chosen) < n:
        for eid in order:
            tests = [t for t in by_entry[eid] if (eid, t) not in chosen]
            if tests and len(chosen) < n:
                chosen.append((eid, rng.choice(tests)))
    out: dict[str, list[Any]] = {}
    for qtype, _label in QUESTION_TYPES:
        items = {(it.entry_id, it.test_id): it
                 for it in expand_needle_set(entries, [qtype])}
        out[qtype] = [items[key] for key in chosen]
    return out


def build_demo_trials(tokenizer: Any, n: int, length: int, haystack: Path | None = None,
                      seed: int = 0) -> dict[str, list[Any]]:
    """The demo's trials: ``{"direct": [...], "onehop": [...]}``, ``n`` each.

    A tokenizer with a chat template gets it (and the set's chat-style task template);
    one without gets the completion template. Depths cycle over :data:`DEPTHS`.

    Raises:
        DataFormatError, HaystackTooShortError, TrialError: bad ``n``, a haystack too
            short for ``length`` (see :func:`locos_tl.data.build_nolima_trials`).
    """
    from locos_tl.data import PromptBuilder, build_nolima_trials, load_haystack

    chat = bool(getattr(getattr(tokenizer, "tokenizer", tokenizer), "chat_template", None))
    hay = load_haystack(haystack or DEFAULT_HAYSTACK)
    builder = PromptBuilder(tokenizer)
    out: dict[str, list[Any]] = {}
    for qtype, items in pick_items(n, seed).items():
        trials = []
        for i, item in enumerate(items):
            trials += build_nolima_trials(
                tokenizer, [item], [hay], lengths=[length], depths=[DEPTHS[i % len(DEPTHS)]],
                chat_template=chat, template="default" if chat else "completion",
                builder=builder)
        out[qtype] = trials
    return out


def run_real_demo(out: Path, model: str, *, n_trials: int = N_TRIALS, length: int = LENGTH,
                  haystack: Path | None = None, progress: bool = True,
                  echo: Callable[[str], Any] = print) -> dict[str, dict[str, Any]]:
    """Score LOCOS and Wu on ``direct`` and ``onehop`` trials of a real model.

    Args:
        out: output directory (``direct/`` and ``onehop/`` run directories, one
            ``plotly.min.js``, ``rankings.csv``).
        model: a known real model's name (``locos models list``), fetched.
        n_trials: trials per question type.
        length: prompt length in tokens (chat template included).
        haystack: a plain-text file (default: :data:`DEFAULT_HAYSTACK`).
        progress: tqdm bars while scoring.
        echo: where the tables go.

    Returns:
        ``{"direct": {"locos": HeadScores, "wu": HeadScores}, "onehop": {...}}``.

    Raises:
        ModelLoadError: unknown or not fetched model (the message says how to fetch).
        DataFormatError, TrialError: bad ``n_trials`` or a haystack too short.
    """
    import pandas as pd

    from locos_tl.cli.demo_tables import ranking_table
    from locos_tl.cli.score import write_outputs
    from locos_tl.data.hub import load_tokenizer
    from locos_tl.experiments.score import score_methods
    from locos_tl.models.load import load_model
    from locos_tl.models.zoo import get_real_model, resolve_checkpoint

    entry = get_real_model(model)
    directory = resolve_checkpoint(entry.name)  # ModelLoadError when not fetched
    t0 = time.perf_counter()
    runs = build_demo_trials(load_tokenizer(directory), n_trials, length, haystack)
    bridge = load_model(entry.name, device="cpu", dtype="float32")
    echo(f"{entry.name} ({entry.shape} heads, {entry.quantization} weights dequantized to "
         f"float32): {n_trials} needles of the {NEEDLE_SET} set asked two ways, prompts of "
         f"{length} tokens (trials and model ready in {time.perf_counter() - t0:.0f} s)")
    out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, dict[str, Any]] = {}
    rows = []
    for qtype, label in QUESTION_TYPES:
        res = score_methods(bridge, runs[qtype], methods=["locos", "wu"],
                            max_new_tokens=MAX_NEW_TOKENS, out_dir=out / qtype,
                            progress=progress)
        write_outputs(res, out / qtype, js_dir=out)
        summary[qtype] = res
        meta = res["locos"].meta
        acc = meta["n_accepted"] / max(meta["n_trials"], 1)
        echo(f"\n== {label}: {meta['n_accepted']}/{meta['n_trials']} answered (accuracy "
             f"{acc:.2f}); top heads by LOCOS vs Wu copy score")
        table = ranking_table(res, {}).drop(columns=["locos role", "wu role"])
        echo(table.to_string(index=False, na_rep=""))
        rows.append(table.assign(run=qtype))
    pd.concat(rows).to_csv(out / "rankings.csv", index=False)
    echo("\n" + overlap_line(summary))
    return summary


def overlap_line(summary: dict[str, dict[str, Any]], k: int = 10) -> str:
    """How many of the top-``k`` heads the rankings share (LOCOS direct vs onehop, LOCOS
    vs Wu on onehop)."""
    from locos_tl.errors import LocosError

    def top(qtype: str, method: str) -> set[tuple[int, int]]:
        hs = summary[qtype][method]
        try:
            return set() if hs.all_zero else set(hs.top_k(min(k, hs.n_layers * hs.n_heads)))
        except LocosError:  # no accepted trial
            return set()

    a, b = top("direct", "locos"), top("onehop", "locos")
    c = top("onehop", "wu")
    return (f"top-{k} overlap: LOCOS literal vs non-literal {len(a & b)}/{k}; "
            f"LOCOS vs Wu on non-literal {len(b & c)}/{k}")


def demo_command(out: Path, model: str, *, length: int | None, n_trials: int | None,
                 book: Path | None) -> None:
    """``locos demo --model NAME`` for a real model: the sizes left at the organism demo's
    defaults (``--length 1024``, ``--n-trials 40``) become this demo's (500 tokens, 8
    needles); ``--book FILE`` (or a folder: its first ``.txt``) replaces the haystack.

    Exits with code 2 and a one-line error on a bad model, size or haystack.
    """
    import typer

    from locos_tl.cli.demo_tables import files_summary
    from locos_tl.errors import LocosError

    haystack = book
    if book is not None and book.is_dir():
        txt = sorted(book.glob("*.txt"))
        haystack = txt[0] if txt else book / "(no .txt file)"
    t0 = time.perf_counter()
    try:
        summary = run_real_demo(out, model, n_trials=n_trials or N_TRIALS, length=length or LENGTH,
                                haystack=haystack, echo=typer.echo)
    except (LocosError, FileNotFoundError) as exc:
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        raise typer.Exit(code=2) from exc
    typer.echo(
        "\nLOCOS scores what a head writes toward the answer from the needle; the Wu copy "
        "score only counts heads whose most attended token is the one they output, which "
        "a non-literal question does not supply.\n"
        f"{files_summary(out, list(summary))}\n({time.perf_counter() - t0:.0f} s)")
