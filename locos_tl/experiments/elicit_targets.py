"""How well a model retrieves beside distractor needles, on held-out entries: the targets
of an elicited model (:mod:`locos_tl.organisms.elicit`) and its controls.

Every cell is greedy decoding on NoLiMa trials of the evaluation needle set (links and
names never trained on) in the evaluation books, chat template (the completion form for a
base model without one), with ``distractors``
needles of other entries; a response names the target (NoLiMa ``contains``), a distractor,
or neither. A ``made_up`` cell asks about a made-up word ("Which character is a florp?"),
a link no model can know: target and distractor should be named equally often.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from locos_tl.data.haystack import Haystack
from locos_tl.data.nolima import NoLiMaEntry, expand_needle_set, prompt_form, resolve_template
from locos_tl.data.nolima_trials import build_nolima_trials
from locos_tl.data.prompt import PromptBuilder
from locos_tl.experiments.evaluate import ablation_sweep
from locos_tl.experiments.protocol.common import EVAL_DEPTHS, EVAL_SEED, _names
from locos_tl.trials import Trial

#: (question, prompt length, distractor needles): the cells reported
CELLS: tuple[tuple[str, int, int], ...] = (
    ("onehop", 1000, 1), ("direct", 1000, 1), ("made_up", 1000, 1),
    ("onehop", 1000, 3), ("direct", 1000, 3), ("onehop", 2000, 1), ("direct", 2000, 1),
)

#: nonce words for the ``made_up`` question (none is an English word)
MADE_UP_WORDS = ("florp", "dax", "wug", "blicket", "zorb", "tupa", "kiki", "fendle",
                 "mib", "gazzer", "plonk", "snerb")


def made_up_entries(entries: Sequence[NoLiMaEntry]) -> list[NoLiMaEntry]:
    """The entries with one question, ``made_up``: "Which character is a <nonce word>?"."""
    out = []
    for i, e in enumerate(entries):
        word = MADE_UP_WORDS[i % len(MADE_UP_WORDS)]
        out.append(dataclasses.replace(
            e, questions={"made_up": f"Which character is a {word}?"}))
    return out


def cell_trials(tokenizer: Any, entries: Sequence[NoLiMaEntry],
                haystacks: Sequence[Haystack], *, question: str, length: int,
                distractors: int, n: int, builder: PromptBuilder | None = None,
                template: str = "auto") -> list[Trial]:
    """``n`` evaluation trials of one cell (the protocol's evaluation names, depths and
    seed), in the prompt form ``template`` (:func:`~locos_tl.data.nolima.resolve_template`:
    ``"auto"`` is the chat template when the tokenizer has one, else the completion form).

    Raises:
        DataFormatError: an unknown form, or ``"chat"`` without a chat template.
    """
    if question == "made_up":
        entries = made_up_entries(entries)
    items = [_names(i, 1) for i in expand_needle_set(entries, [question])]
    form = prompt_form(resolve_template(template, tokenizer))
    return build_nolima_trials(tokenizer, items, haystacks, lengths=[length],
                               depths=EVAL_DEPTHS, num_examples=n, seed=EVAL_SEED,
                               builder=builder, distractors=distractors, **form)


def answer_rates(model: Any, trials: Sequence[Trial], out_dir: str | Path | None = None,
                 max_new_tokens: int = 16) -> dict[str, float]:
    """Fractions of greedy answers that name the target (``target``), a distractor
    (``distractor``), the target and no distractor (``target_only``), and the mean
    teacher-forced name margin (``name_margin``, nats; :mod:`locos_tl.experiments.margin`).
    ``out_dir`` makes the run resumable."""
    # no head set: only the unablated baseline is generated (the mode is never applied)
    df = ablation_sweep(model, list(trials), {}, k=[1], mode="query_zero", random=False,
                        bottom=None, out_dir=out_dir, max_new_tokens=max_new_tokens,
                        name_margin=True, progress=False)
    base = df[df["method"] == "baseline"].set_index("metric")
    v = base["value"]
    return {"n": int(base["n_trials"].iloc[0]), "target": float(v["contains"]),
            "distractor": float(v["contains_distractor"]),
            "target_only": float(v["target_only"]), "name_margin": float(v["name_margin"])}


@torch.no_grad()
def perplexity(model: Any, text: str, *, chunks: int = 20, tokens: int = 512) -> float:
    """Perplexity (exp of mean next-token cross-entropy, nats) of ``chunks`` evenly spaced
    windows of ``tokens`` tokens of ``text`` (a BOS first when the tokenizer has one)."""
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    step = max(1, (len(ids) - tokens) // chunks)
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    total = count = 0.0
    for c in range(chunks):
        window = torch.tensor([bos + ids[c * step:c * step + tokens]])
        logits = model(window, return_type="logits")[0, :-1].float()
        target = window[0, 1:].to(logits.device)
        nll = torch.nn.functional.cross_entropy(logits, target, reduction="sum")
        total += float(nll)
        count += target.numel()
    return math.exp(total / count)


def targets_table(model: Any, entries: Sequence[NoLiMaEntry],
                  haystacks: Sequence[Haystack], *, n: dict[tuple[str, int, int], int],
                  out_dir: str | Path) -> pd.DataFrame:
    """One row per cell of ``n`` (cell -> trials): ``question``, ``length``,
    ``distractors`` and :func:`answer_rates`. Resumable through ``out_dir``."""
    builder = PromptBuilder(model.tokenizer)
    rows = []
    for (question, length, k), count in n.items():
        trials = cell_trials(model.tokenizer, entries, haystacks, question=question,
                             length=length, distractors=k, n=count, builder=builder)
        sub = Path(out_dir) / f"{question}_{length}_d{k}"
        rows.append({"question": question, "length": length, "distractors": k,
                     **answer_rates(model, trials, sub)})
    return pd.DataFrame(rows)
