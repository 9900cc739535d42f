"""Helpers for the data-layer tests: two tokenizers trained here on the shipped books
(byte-level BPE as in Qwen / Llama 3, and SentencePiece-style BPE with ``▁`` and byte
fallback as in Gemma), and needle sets / probe files written by the tests themselves.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from locos_tl.data.packaged import book_dir, niah_probes_path

BOOKS = sorted(book_dir().glob("*.txt"))  # the books shipped with locos_tl
NIAH_FILE = niah_probes_path()

# Qwen3-like template: honours enable_thinking=False with an empty think block.
QWEN_CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
# Gemma-2-like template: BOS in the text, no system role, content trimmed.
GEMMA_CHAT = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _corpus(max_chars: int = 300_000) -> list[str]:
    text = "".join(p.read_text(encoding="utf-8") for p in BOOKS)[:max_chars]
    return [text[i : i + 8000] for i in range(0, len(text), 8000)]


def _bytelevel() -> PreTrainedTokenizerFast:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(_corpus(), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    hf.chat_template = QWEN_CHAT
    return hf


def _metaspace() -> PreTrainedTokenizerFast:
    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=specials, show_progress=False)
    tk.train_from_iterator(_corpus(), trainer)
    # Add the 256 byte-fallback pieces <0x00>..<0xFF> to the model vocabulary.
    spec = json.loads(tk.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tk = Tokenizer.from_str(json.dumps(spec))
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    bos = tk.token_to_id("<bos>")
    tk.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", bos)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>",
        pad_token="<pad>", additional_special_tokens=["<start_of_turn>", "<end_of_turn>"],
    )
    hf.chat_template = GEMMA_CHAT
    return hf


_TOKENIZERS: dict[str, PreTrainedTokenizerFast] = {}


def get_tokenizer(kind: str) -> PreTrainedTokenizerFast:
    """Session cache of the trained tokenizers (also usable inside hypothesis tests)."""
    if kind not in _TOKENIZERS:
        _TOKENIZERS[kind] = {"bytelevel": _bytelevel, "metaspace": _metaspace}[kind]()
    return _TOKENIZERS[kind]


def needle_set_entries(distractors: bool = False) -> list[dict]:
    """An invented needle set in the published NoLiMa format."""
    entries = [
        {
            "id": "0101",
            "reasoning_type": "world_knowledge",
            "system_prompt": "You are a helpful assistant.",
            "needle": "Actually, {CHAR} lives next to {1}.",
            "questions": {
                "onehop": "Which character has been to {2}?",
                "twohop": "Which character has been to {3}?",
            },
            "character_set": ["Yuki", "Stuart", "Katie", "Mandla", "Zoë Ngata"],
            "tests": {
                "T01": {"input_args": ["the Harbour Bridge", "Sydney", "New South Wales"]},
                "T02": {"input_args": ["the Sky Tower", "Auckland", "the North Island"]},
            },
        },
        {
            "id": "0202",
            "reasoning_type": "commonsense",
            "system_prompt": "",
            "task_template": (
                "Read this excerpt.\n\n<text>\n{haystack}\n</text>\n\nQ: {question}\nA:"
            ),
            "needle": "{CHAR} was finally allowed to see {1} last spring.",
            "questions": {"onehop": "Which character has seen {2}?"},
            "character_set": ["Diego", "Megan", "Olumide"],
            "tests": {
                "T01": {"input_args": ["the Louvre's most famous portrait", "the Mona Lisa"]}
            },
        },
    ]
    if distractors:
        entries[0]["distractors"] = {
            "onehop": "There was an article about {2} in the morning paper.",
            "twohop": "There was an article about {3} in the morning paper.",
        }
        entries[1]["distractors"] = {"onehop": "Someone mentioned {2} at dinner."}
    return entries


_BUILDERS: dict[int, object] = {}


def builder_for(tok):
    """One PromptBuilder per tokenizer, so each book is tokenised once per session."""
    from locos_tl.data import PromptBuilder

    if id(tok) not in _BUILDERS:
        _BUILDERS[id(tok)] = PromptBuilder(tok)
    return _BUILDERS[id(tok)]
