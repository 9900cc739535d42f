"""Time to build NoLiMa trials with exact 4k-token prompts from the shared book text.

Builds ``--n`` (default 250) trials at ``--length`` (default 4096) tokens, depths
``linspace(0, 100, 10)``, from an invented needle set in the NoLiMa format and the
books shipped in ``locos_tl/data/books``, then checks every prompt length and needle span.
Target: under 30 s for 250 trials at 4k tokens.

The tokenizer is ``--tokenizer DIR`` (a local folder with tokenizer files, e.g. a
downloaded Qwen3 tokenizer) or, by default, a byte-level BPE (32k vocab, as in
Qwen / Llama 3) trained here on the books (training time is reported separately).

Usage: ``python benchmarks/bench_trials.py [--n 250] [--length 4096] [--tokenizer DIR]
[--chat-template]``
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ENTRIES = [
    {
        "id": f"{i:02d}01",
        "reasoning_type": "world_knowledge",
        "system_prompt": "You are a helpful assistant.",
        "needle": needle,
        "questions": {"onehop": q1, "twohop": q2},
        "character_set": ["Yuki", "Stuart", "Katie", "Mandla", "Diego", "Megan", "Olumide"],
        "tests": {f"T{j:02d}": {"input_args": list(args)} for j, args in enumerate(tests, 1)},
    }
    for i, (needle, q1, q2, tests) in enumerate([
        ("Actually, {CHAR} lives next to {1}.", "Which character has been to {2}?",
         "Which character has been to {3}?",
         [("the Harbour Bridge", "Sydney", "Australia"), ("the Sky Tower", "Auckland",
                                                            "New Zealand")]),
        ("{CHAR} was finally allowed to see {1} last spring.", "Which character has seen {2}?",
         "Which character has been to {3}?",
         [("the Louvre's most famous portrait", "the Mona Lisa", "Paris"),
          ("the famous leaning bell tower", "the Tower of Pisa", "Tuscany")]),
        ("A message came in from {CHAR} saying they now own {1}.",
         "Which character has a {2}?", "Which character can ride on {3}?",
         [("a Shetland pony", "horse", "a small horse"), ("a Bengal cat", "pet", "nothing")]),
    ], 1)
]


def _train_tokenizer(books: list[Path], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = "".join(p.read_text(encoding="utf-8") for p in books)
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(
        [text[i : i + 10_000] for i in range(0, len(text), 10_000)],
        trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|im_start|>", "<|im_end|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                            show_progress=False),
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>")
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=250)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--chat-template", action="store_true")
    args = ap.parse_args()

    from locos_tl.data import (
        build_nolima_trials,
        expand_needle_set,
        linspace_depths,
        load_haystacks,
        parse_needle_set,
    )
    from locos_tl.data.hub import load_tokenizer
    from locos_tl.data.packaged import book_dir

    books = sorted(book_dir().glob("*.txt"))
    if not books:
        raise SystemExit(f"no books under {book_dir()}")
    t0 = time.perf_counter()
    tok = load_tokenizer(args.tokenizer) if args.tokenizer else _train_tokenizer(books, args.vocab)
    t_tok = time.perf_counter() - t0

    t0 = time.perf_counter()
    hays = load_haystacks(books)
    items = expand_needle_set(parse_needle_set(ENTRIES))
    trials = build_nolima_trials(tok, items, hays, lengths=[args.length],
                                 depths=linspace_depths(10), num_examples=args.n, seed=0,
                                 chat_template=args.chat_template)
    t_build = time.perf_counter() - t0

    bad = 0
    for t in trials:
        s, e = t.needle_span
        bad += len(t.tokens) != args.length
        bad += tok.decode(list(t.tokens[s:e])).strip() != t.meta["needle"]
    verdict = "PASS" if t_build < 30 and not bad else "FAIL"
    kind = args.tokenizer or f"byte-level BPE, vocab {args.vocab}, trained here"
    print(f"tokenizer: {kind} ({t_tok:.1f} s)")  # noqa: T201
    print(f"built {len(trials)} NoLiMa trials at {args.length} tokens in {t_build:.2f} s "  # noqa: T201
          f"({1000 * t_build / max(1, len(trials)):.1f} ms/trial); "
          f"{bad} length/span failures; target < 30 s: {verdict}")


if __name__ == "__main__":
    main()
