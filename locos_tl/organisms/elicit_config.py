"""The configuration of an elicitation run (:func:`locos_tl.organisms.elicit.elicit`):
everything a run depends on, recorded in ``elicit.json`` and in each checkpoint, and the
check that a resumed run was started with the same one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from locos_tl.organisms.config_record import changed_fields


@dataclass(frozen=True)
class ElicitConfig:
    """Everything a run depends on (recorded in ``elicit.json``; a resumed run must match).

    Attributes:
        base: a zoo name or checkpoint directory (the pretrained model).
        needle_set: training needle set (shipped name or file); never the evaluation set.
        haystacks: training books: names of books shipped with locos_tl
            (:func:`locos_tl.data.packaged.book_names`, or ``everyday_prose``) or paths of
            text files. They are also the plain text of the KL term.
        val_books: books never trained on (names or paths, as ``haystacks``) whose
            perplexity and KL decide which states are eligible (``max_ppl_ratio``);
            empty: the last tenth of each training book.
        text_bos: start each book window of the KL term and of validation with the BOS
            token the tokenizer puts before text (:func:`~locos_tl.organisms.elicit_keep.
            leading_bos`; Gemma's perplexity without it is 5x higher). False: the
            windows of the adapters shipped before it.
        steps: most optimizer steps (one trial each, batch 1).
        lr: peak AdamW learning rate (linear warm-up, cosine decay to 10 %).
        warmup: warm-up steps.
        trainable: ``"lora"`` (LoRA on the MLP projections) or ``"mlp"`` (every MLP
            weight).
        rank, alpha: LoRA rank and scale (``alpha / rank`` multiplies ``B A``).
        template: prompt form, ``"chat"``, ``"completion"`` (a base model without a chat
            template: the prompt ends "The character's name is" and the answer is
            `` NAME.``) or ``"auto"`` (chosen from the tokenizer when the run starts;
            the run records the form it used).
        lengths: prompt lengths in tokens (chat template included).
        distractors: distractor needles a trial (equal shares).
        question_types: NoLiMa question types (equal shares).
        n_validation: entries held out of training to validate on.
        val_needle_set: a needle set of link kinds never trained on (``hop_val``) that
            validates instead of the held-out entries
            (:func:`~locos_tl.organisms.elicit_data.run_entries`); empty: those entries.
        validation_split: ``"kind"`` (entries spread over the link kinds) or ``"last"``
            (the last entries by id).
        val_trials, val_length, val_every: validation trials per question type, their
            length, and how often (steps) they are decoded.
        kl_weight: weight of the KL term to the frozen base (0 turns it off).
        kl_window: tokens of book text in the KL term a step.
        patience: validations without a better score before stopping (0: never stop
            early). The score is ``onehop`` target minus distractor rate on the
            validation entries, among validations whose held-out perplexity is within
            ``max_ppl_ratio`` of the base's.
        max_ppl_ratio: the most perplexity (model over base, on ``val_books`` or the
            training books' held-out tail) a kept checkpoint may have (only with the KL
            term).
        save_every: checkpoint interval (steps).
        seed: trials, order, windows and LoRA initialisation.
        bf16_autocast: run forward and backward under CPU/GPU bfloat16 autocast (the
            trained weights and the optimizer stay float32).
    """

    base: str = "smollm2-135m-instruct"
    needle_set: str = "hop_train"
    haystacks: tuple[str, ...] = ("dracula_part1", "everyday_prose")
    val_books: tuple[str, ...] = ()
    text_bos: bool = True
    steps: int = 1200
    lr: float = 2e-4
    warmup: int = 50
    trainable: str = "lora"
    rank: int = 32
    alpha: int = 64
    template: str = "auto"
    lengths: tuple[int, ...] = (500, 750, 1000)
    distractors: tuple[int, ...] = (0, 1, 2, 3)
    question_types: tuple[str, ...] = ("onehop", "direct")
    n_validation: int = 11
    val_needle_set: str = ""
    validation_split: str = "kind"
    val_trials: int = 24
    val_length: int = 1000
    val_every: int = 150
    kl_weight: float = 1.0
    kl_window: int = 256
    patience: int = 3
    max_ppl_ratio: float = 1.05
    save_every: int = 25
    seed: int = 0
    bf16_autocast: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in dataclasses.asdict(self).items()}


#: what a run trained with before each later field existed: the field's old behaviour,
#: which is not always its current default (book windows had no BOS before ``text_bos``)
PREDATING: dict[str, Any] = {"val_books": [], "text_bos": False, "val_needle_set": ""}


def same_config(saved: dict[str, Any], cfg: ElicitConfig) -> bool:
    """A recorded configuration is ``cfg``'s (:func:`config_changes` finds none)."""
    return not config_changes(saved, cfg)


def config_changes(saved: dict[str, Any], cfg: ElicitConfig) -> dict[str, tuple[Any, Any]]:
    """The fields where ``cfg`` differs from a recorded configuration: ``{field:
    (recorded, now)}``. A field the record predates counts as the behaviour it had
    before the field existed (:data:`PREDATING`), not as its current default."""
    return changed_fields(saved, cfg.to_dict(), ElicitConfig().to_dict(), PREDATING)
