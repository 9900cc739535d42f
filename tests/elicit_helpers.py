"""Shared by the elicitation tests: the tiny Llama checkpoint as a Hugging Face model and
tokenizer, and short trials whose answer the tiny model can be trained to name."""

from __future__ import annotations

import torch

from locos_tl.trials import Trial


def hf_model(tiny_dirs):
    """``(model, tokenizer)`` of the tiny random-init Llama, float32."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = tiny_dirs["llama"]
    return AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32), \
        AutoTokenizer.from_pretrained(d)


def name_trials(tok, n=4):
    """``n`` one-sentence trials answered "Yuki" or "Anna" in turn."""
    out = []
    for i in range(n):
        text = f"The lazy dog near the river is {['Yuki', 'Anna'][i % 2]}. Which one?"
        out.append(Trial(tok(text)["input_ids"], (0, 4), ["Yuki", "Anna"][i % 2],
                         prompt=text))
    return out
