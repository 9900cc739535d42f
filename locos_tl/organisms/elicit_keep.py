"""Keep the model while eliciting a hop: a KL term to the frozen base model's next-token
distribution on plain book text and on prompts that are not retrieval (facts, two-digit
arithmetic, plain chat), each answered by the frozen base itself.

``loss = CE(answer | NoLiMa trial) + kl_weight * (KL_text + KL_prompts)`` where each KL
is ``mean_t sum_v p_base(v | x_<t) (log p_base(v | x_<t) - log p_model(v | x_<t))`` in
nats per token (the forward KL of distillation, Hinton et al. 2015; the KL anchor of
RLHF, Ouyang et al. 2022, Eq. 2, here to the base's next-token distribution).

None of these prompts is a control question of :mod:`locos_tl.data.controls` (the
specificity controls are evaluated on those): the facts name other subjects, the sums
have two digits where the controls have one. The last tenth of each book's tokens and
every eighth prompt are held out to validate on.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float

#: factual questions a chat model answers from its weights (none is a control question)
KEEP_FACTS = (
    "What is the capital of Peru?", "What is the capital of Kenya?",
    "What is the capital of Norway?", "What is the capital of Argentina?",
    "What is the capital of Thailand?", "What is the capital of Portugal?",
    "Who wrote the play Hamlet?", "Who painted the ceiling of the Sistine Chapel?",
    "Who composed the Moonlight Sonata?", "Who wrote the novel Moby-Dick?",
    "Who invented the telephone?", "Who was the first president of the United States?",
    "What gas do plants take in from the air?", "How many legs does a spider have?",
    "What is the freezing point of water in Fahrenheit?", "How many days are in a leap year?",
    "Which planet is closest to the Sun?", "What is the hardest natural substance?",
    "What is the longest river in Africa?", "Which ocean lies between Europe and America?",
    "What is the main language of Mexico?", "What is the currency of the United Kingdom?",
    "How many continents are there?", "What colour do you get by mixing blue and yellow?",
    "What is the largest mammal?", "Which organ pumps blood through the body?",
    "What do bees make?", "What is the opposite of hot?",
    "How many minutes are in an hour?", "What is the plural of mouse?",
    "Which animal is known as the king of the jungle?", "What is frozen water called?",
)

#: plain chat requests (no context to retrieve from)
KEEP_CHAT = (
    "Write one sentence about the sea.", "Give me a tip for sleeping well.",
    "Describe a cat in a few words.", "Say hello in a friendly way.",
    "Suggest a name for a small bakery.", "What is a good breakfast?",
    "Write a short line about autumn.", "How can I stay focused while studying?",
    "Tell me something nice about trees.", "Explain what a map is.",
    "Give one reason to drink water.", "Describe the colour red.",
    "What should I pack for a picnic?", "Write a short thank-you note.",
    "How do I boil an egg?", "Name three fruits.",
)


def keep_questions(seed: int = 0, n_arithmetic: int = 32) -> list[str]:
    """The non-retrieval prompts: :data:`KEEP_FACTS`, ``n_arithmetic`` two-digit sums and
    differences (seeded), and :data:`KEEP_CHAT`, interleaved in a seeded order."""
    rng = random.Random(f"keep:{seed}")
    sums = []
    for _ in range(n_arithmetic):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        op = rng.choice("+-")
        a, b = (a, b) if op == "+" or a >= b else (b, a)
        sums.append(f"What is {a} {op} {b}?")
    out = [*KEEP_FACTS, *sums, *KEEP_CHAT]
    rng.shuffle(out)
    return out


def _prompt_ids(tokenizer: Any, question: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                             tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(f"Question: {question}\nAnswer:")["input_ids"]


@torch.no_grad()
def keep_sequences(tokenizer: Any, base: Any, questions: Sequence[str], *,
                   cache: Path | None = None, key: str = "", max_new_tokens: int = 32,
                   device: str = "cpu") -> list[list[int]]:
    """Each question twice (chat template; ``Question: ... Answer:``), followed by the
    frozen base model's own greedy answer: the sequences the KL term is taken on.

    ``cache`` (a JSON file) keeps the answers, so a resumed run does not regenerate them;
    it is used only when its questions and ``key`` (name the base model's weights) match.
    """
    if cache is not None and cache.exists():
        stored = json.loads(cache.read_text())
        if stored["questions"] == list(questions) and stored.get("key") == key:
            return stored["sequences"]
    out = []
    for q in questions:
        for chat in (True, False):
            ids = torch.tensor([_prompt_ids(tokenizer, q, chat)], device=device)
            gen = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=tokenizer.eos_token_id)
            out.append(gen[0].tolist())
    if cache is not None:
        cache.write_text(json.dumps({"questions": list(questions), "key": key,
                                     "sequences": out}))
    return out


def book_tokens(tokenizer: Any, texts: Sequence[str]) -> list[list[int]]:
    """Each book's tokens (no special tokens)."""
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@dataclass
class KeepData:
    """What the KL term needs: the frozen base and its token sequences.

    Attributes:
        base: the frozen base model: a Hugging Face causal LM with ``requires_grad``
            off, or :class:`AdapterOff` of the LoRA model being trained.
        books: each training book's tokens; the last ``hold_out`` fraction validates
            unless ``val_books`` are given.
        prompts: :func:`keep_sequences`; every ``val_every_nth``-th validates.
        window: tokens of book text a step.
        weight: the KL weight.
        seed: picks the window and prompt of each step.
        val_books: tokens of books never trained on; when given, the held-out windows
            are spread over them instead of the training books' tails.
        bos: a token put before every book window (the tokenizer's BOS), or ``None``.
    """

    base: Any
    books: list[list[int]]
    prompts: list[list[int]]
    window: int = 256
    weight: float = 1.0
    seed: int = 0
    hold_out: float = 0.1
    val_every_nth: int = 8
    val_books: list[list[int]] = field(default_factory=list)
    bos: int | None = None

    def _with_bos(self, window: list[int]) -> list[int]:
        return window if self.bos is None else [self.bos, *window]

    def _split(self, toks: list[int]) -> int:
        return int(len(toks) * (1 - self.hold_out))

    def train_window(self, step: int) -> list[int]:
        """The book window of training step ``step`` (seeded by step: resumable)."""
        rng = random.Random(f"kl-text:{self.seed}:{step}")
        toks = self.books[rng.randrange(len(self.books))]
        end = self._split(toks) - self.window
        start = rng.randrange(max(1, end))
        return self._with_bos(toks[start:start + self.window])

    def train_prompt(self, step: int) -> list[int]:
        rng = random.Random(f"kl-prompt:{self.seed}:{step}")
        pool = [p for i, p in enumerate(self.prompts) if i % self.val_every_nth]
        return pool[rng.randrange(len(pool))]

    def val_windows(self, n: int = 8) -> list[list[int]]:
        """``2 n`` windows spread evenly over each validation book, or else ``n``
        consecutive windows from the held-out tail of each training book."""
        out = []
        for toks in self.val_books:
            starts = range(0, len(toks) - self.window + 1, self.window)
            out += [self._with_bos(toks[s:s + self.window])
                    for s in starts[::max(1, len(starts) // (2 * n))]][:2 * n]
        for toks in [] if self.val_books else self.books:
            tail = toks[self._split(toks):]
            out += [self._with_bos(tail[i:i + self.window])
                    for i in range(0, len(tail) - self.window + 1, self.window)][:n]
        return out

    def val_prompts(self) -> list[list[int]]:
        return [p for i, p in enumerate(self.prompts) if not i % self.val_every_nth]


class AdapterOff:
    """The base model seen through a peft model with its adapters turned off, in eval
    mode: the KL term's reference without a second copy of the base weights.

    Calling it (or its ``generate``) runs the peft model under ``disable_adapter()``,
    which computes each adapted layer as its base layer alone, so the logits are the
    frozen base's bit for bit. The adapters and the training mode are restored after
    each call.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def _off(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        was_training = self.model.training
        self.model.eval()
        try:
            with self.model.disable_adapter():
                return fn(*args, **kwargs)
        finally:
            self.model.train(was_training)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._off(self.model, *args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self._off(self.model.generate, *args, **kwargs)


def keep_data(tokenizer: Any, base_dir: Path, books: Sequence[Path],
              val_books: Sequence[Path], cfg: Any, out: Path, *, key: str,
              base: Any = None, device: str = "cpu",
              log: Callable[[str], None] = print) -> KeepData:
    """The KL term's data for an elicit run (``cfg``: its
    :class:`~locos_tl.organisms.elicit.ElicitConfig`): the frozen base, the training and
    validation books' tokens, and the non-retrieval prompts answered by the base (cached
    in ``out/keep_prompts.json`` under ``key``, the base weights' hash).

    ``base`` is the reference model (:class:`AdapterOff` for a LoRA run); without it a
    frozen float32 copy is loaded from ``base_dir`` (full-MLP training changes the
    model's own weights, so it needs one)."""
    if base is None:
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).to(device)
        base.eval().requires_grad_(False)
    out.mkdir(parents=True, exist_ok=True)
    log("answering the non-retrieval prompts with the frozen base")
    prompts = keep_sequences(tokenizer, base, keep_questions(cfg.seed), device=device,
                             cache=out / "keep_prompts.json", key=key)
    read = lambda paths: book_tokens(  # noqa: E731
        tokenizer, [Path(b).read_text(encoding="utf-8") for b in paths])
    return KeepData(base=base, books=read(books), prompts=prompts, window=cfg.kl_window,
                    weight=cfg.kl_weight, seed=cfg.seed, val_books=read(val_books),
                    bos=leading_bos(tokenizer) if cfg.text_bos else None)


def leading_bos(tokenizer: Any) -> int | None:
    """The BOS token ``tokenizer`` puts before text (Gemma's ``<bos>``), or ``None`` where
    it puts none (SmolLM2, whose BOS is the chat marker ``<|im_start|>``)."""
    ids = tokenizer("a")["input_ids"]
    bos = tokenizer.bos_token_id
    return bos if bos is not None and ids[:1] == [bos] else None


def kl_to_base(model: Any, base: Any, ids: Sequence[int], *, device: str = "cpu",
               autocast: bool = False) -> Float[torch.Tensor, ""]:
    """Mean over positions of ``KL(p_base || p_model)`` of the next token (nats per
    token), differentiable in ``model``'s trainable weights."""
    x = torch.tensor([list(ids)], device=device)
    with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                        enabled=autocast):
        with torch.no_grad():
            ref = base(input_ids=x).logits[0].float().log_softmax(-1)
        cur = model(input_ids=x).logits[0].float().log_softmax(-1)
    return F.kl_div(cur, ref, log_target=True, reduction="sum") / x.shape[1]


@torch.no_grad()
def keep_validation(model: Any, keep: KeepData, *, device: str = "cpu",
                    autocast: bool = False) -> dict[str, float]:
    """On held-out book windows and prompts: ``kl_text`` and ``kl_prompts`` (nats per
    token, as :func:`kl_to_base`), and ``ppl_ratio``: the model's perplexity on the
    windows over the base's (both under the same autocast)."""
    def logprobs(m: Any, ids: Sequence[int]) -> torch.Tensor:
        x = torch.tensor([list(ids)], device=device)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16,
                            enabled=autocast):
            return m(input_ids=x).logits[0].float().log_softmax(-1)

    kl_text, nll_model, nll_base = 0.0, 0.0, 0.0
    windows = keep.val_windows()
    for w in windows:
        cur, ref = logprobs(model, w), logprobs(keep.base, w)
        kl_text += float(F.kl_div(cur, ref, log_target=True, reduction="sum")) / len(w)
        nxt = torch.tensor(w[1:], device=device)
        nll_model += float(-cur[:-1].gather(1, nxt[:, None]).mean())
        nll_base += float(-ref[:-1].gather(1, nxt[:, None]).mean())
    prompts = keep.val_prompts()
    kl_prompts = sum(float(F.kl_div(logprobs(model, p), logprobs(keep.base, p),
                                    log_target=True, reduction="sum")) / len(p)
                     for p in prompts) / max(1, len(prompts))
    ratio = math.exp((nll_model - nll_base) / len(windows))
    return {"kl_text": kl_text / len(windows), "kl_prompts": kl_prompts, "ppl_ratio": ratio}
