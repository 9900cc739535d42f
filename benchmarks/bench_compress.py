"""Memory and time of head-level KV-cache compression, measured.

For one trial per context length, with a greedy LOCOS-style ranking (random scores
here: memory and time do not depend on which heads are kept), prints per retained
fraction:

- ``kv MB``: bytes of the stored context K/V tensors after compression (``nbytes`` of
  the ragged per-group tensors, measured) against the full prefilled cache;
- ``decode ms/token``: wall time per greedy decode step over the compressed cache
  (question tokens excluded), against plain greedy decoding with the full cache
  (:func:`locos_tl.engine.decode.greedy_decode`, the scorer's fast path);
- on CUDA, the peak allocated memory during the compressed decode.

The model is a shipped organism (default ``retrieval-long``) or a random-weight
checkpoint of a named shape built on the fly (``--shape qwen3-small``: 4 layers,
d_model 256, 8/2 heads).

Usage: ``python benchmarks/bench_compress.py [--lengths 1024,2048,4096]
[--fractions 0.02,0.1,0.5,1.0] [--shape organism|qwen3-small] [--new 8]``
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch


def _model(shape: str, device: str):
    import locos_tl as lt

    if shape == "organism":
        from locos_tl.organisms import LONG_ORGANISM

        return lt.load_model(LONG_ORGANISM, device=device)
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    d = tempfile.mkdtemp(prefix="bench_compress_")
    cfg = Qwen3Config(vocab_size=3115, hidden_size=256, intermediate_size=512,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                      head_dim=32, max_position_embeddings=8192)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(d)
    from locos_tl.organisms import DEFAULT_ORGANISM

    AutoTokenizer.from_pretrained(DEFAULT_ORGANISM).save_pretrained(d)
    return lt.load_model(d, device=device)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--fractions", default="0.02,0.1,0.5,1.0")
    ap.add_argument("--shape", default="organism", choices=["organism", "qwen3-small"])
    ap.add_argument("--new", type=int, default=8, help="decode steps timed per run")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    from locos_tl.experiments.compress import compressed_generate, context_capacity, kv_budgets
    from locos_tl.experiments.compress.generate import n_heads_of, prefill_context
    from locos_tl.engine.decode import greedy_decode
    from locos_tl.trials import Trial

    model = _model(a.shape, a.device)
    L, H, n_kv = n_heads_of(model)
    scores = np.random.default_rng(0).random((L, H))
    cuda = a.device.startswith("cuda")
    print(f"model {a.shape}: {L} layers, {H} heads / {n_kv} kv heads, device {a.device}")
    print("| context | fraction | kv MB (full) | decode ms/token (full cache) |"
          + (" peak MB |" if cuda else ""))
    print("|---|---|---|---|" + ("---|" if cuda else ""))
    for n in (int(x) for x in a.lengths.split(",")):
        rng = np.random.default_rng(n)
        toks = [int(x) for x in rng.integers(5, 3000, n)]
        trial = Trial(tokens=tuple(toks), needle_span=(n // 2, n // 2 + 2), answer="x",
                      meta={"query_start": n - 2})
        t0 = time.perf_counter()
        greedy_decode(model, toks, max_new_tokens=a.new, stop_at_eos=False)
        full_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        full = prefill_context(model, trial, n - 2)
        prefill_s = time.perf_counter() - t0
        full_ms = 1e3 * max(full_s - prefill_s, 0.0) / a.new
        for f in (float(x) for x in a.fractions.split(",")):
            b = kv_budgets(scores, f, n - 2, n_kv, capacity=context_capacity(model, n - 2))
            compressed_generate(model, trial, b, max_new_tokens=2, full_cache=full)  # warm
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            r = compressed_generate(model, trial, b, max_new_tokens=a.new, full_cache=full,
                                    stop_at_eos=False)
            if cuda:
                torch.cuda.synchronize()
            ms = 1e3 * (time.perf_counter() - t0) / max(len(r.tokens), 1)
            peak = f" {torch.cuda.max_memory_allocated() / 2**20:.0f} |" if cuda else ""
            print(f"| {n} | {f:.0%} | {r.kv_bytes / 2**20:.3f} ({r.full_kv_bytes / 2**20:.3f}) "
                  f"| {ms:.1f} ({full_ms:.1f}) |{peak}", flush=True)


if __name__ == "__main__":
    main()
