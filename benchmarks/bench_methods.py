"""Cost of the baselines and of causal patching.

1. Multi-method overhead: ``score_methods(methods=[locos, wu, headkv, attention_spatial,
   dla])`` (one decode pass) against ``score_trials(method="locos")``. Target: <= 1.2x.
2. CRI cost per trial: naive (one head per run over the whole prompt, ``n_heads + 2``
   forwards), with the shared pre-needle KV cache, and batched as well (``--batch-size``
   heads per forward). On CPU batching saves calls, not FLOPs; it pays off on a GPU.

Random-init Qwen3 checkpoint (GQA, QK-norm) built here; the random model's answers fail
the trial gate, so the gate is disabled (every generated step is still scored the same
way) and CRI reads the metric at the prompt end (``answer_position="prompt_end"``).
Each timing is the minimum over ``--repeats`` interleaved runs (other jobs may share
the CPU).

Usage: ``python benchmarks/bench_methods.py [--layers 4] [--heads 8] [--length 512]
[--n-trials 4] [--new-tokens 8] [--batch-size 16] [--repeats 3] [--device cpu]``
"""

# ruff: noqa: T201  (a benchmark prints its figures)
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import torch

METHODS = ["locos", "wu", "headkv", "attention_spatial", "dla"]


def _trials(tok, n: int, length: int):
    from locos_tl.trials import Trial

    g = torch.Generator().manual_seed(0)
    vocab = len(tok)
    answer = "Yuki"
    out = []
    for i in range(n):
        ids = torch.randint(1, vocab - 1, (length,), generator=g).tolist()
        s = (i + 1) * length // (n + 2)
        out.append(Trial(tokens=ids, needle_span=(s, s + 8), answer=answer, meta={"i": i}))
    return out


def _best(fn, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--n-trials", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from locos_tl.experiments.patching import cri_trial
    from locos_tl.experiments.score import score_methods, score_trials
    from locos_tl.models.load import load_model
    from locos_tl.models.tiny import make_tiny_checkpoint

    torch.set_grad_enabled(False)
    tmp = Path(tempfile.mkdtemp(prefix="bench-methods-"))
    path = make_tiny_checkpoint(
        "qwen3", tmp / "m", hidden_size=args.d_model, intermediate_size=2 * args.d_model,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.length + 64)
    model = load_model(path, device=args.device)
    trials = _trials(model.tokenizer, args.n_trials, args.length)
    n_heads = args.layers * args.heads
    print(f"model: random Qwen3, {args.layers} layers x {args.heads} heads "
          f"({args.kv_heads} kv), d_model {args.d_model}; {args.n_trials} trials of "
          f"{args.length} tokens, {args.new_tokens} new tokens; device {args.device}")

    kw = dict(max_new_tokens=args.new_tokens, gate_threshold=-1.0, progress=False)
    score_trials(model, trials[:1], method="locos", **kw)  # warm-up (SDPA twin, caches)
    t_locos = t_all = math.inf
    for _ in range(args.repeats):  # interleaved, so a load change hits both alike
        t_locos = min(t_locos, _best(lambda: score_trials(model, trials, method="locos",
                                                          **kw), 1))
        t_all = min(t_all, _best(lambda: score_methods(model, trials, methods=METHODS, **kw),
                                 1))
    print("\n1. one decode pass, several methods")
    print(f"   LOCOS alone:        {t_locos / args.n_trials * 1e3:8.1f} ms/trial")
    print(f"   all five methods:   {t_all / args.n_trials * 1e3:8.1f} ms/trial")
    print(f"   ratio:              {t_all / t_locos:8.3f}x   (target <= 1.2x)")

    ckw = dict(answer_position="prompt_end", chunk_size=args.length)
    t_b = t_s = t_full = one_fwd = math.inf
    for _ in range(args.repeats):
        one_fwd = min(one_fwd, _best(lambda: model(torch.tensor([trials[0].tokens]),
                                                   logits_to_keep=1), 1))
        t_b = min(t_b, _best(lambda: [cri_trial(model, t, batch_size=args.batch_size, **ckw)
                                      for t in trials], 1))
        t_s = min(t_s, _best(lambda: [cri_trial(model, t, batch_size=1, **ckw)
                                      for t in trials], 1))
        t_full = min(t_full, _best(lambda: [cri_trial(model, t, batch_size=1, share_prefix=False,
                                                      **ckw) for t in trials], 1))
    n_b = 2 + math.ceil(n_heads / args.batch_size)
    print(f"\n2. CRI, {n_heads} heads per trial")
    print(f"   one plain forward:  {one_fwd * 1e3:8.1f} ms")
    depth = sum(t.needle_span[0] for t in trials) / sum(t.n_tokens for t in trials)
    print(f"   naive (1 head/run, full prompt): {t_full / args.n_trials:8.3f} s/trial "
          f"({n_heads + 2} forwards)")
    print(f"   sequential, shared prefix:       {t_s / args.n_trials:8.3f} s/trial "
          f"(needle at {depth:.0%} depth on average)")
    print(f"   batched ({args.batch_size:>3}), shared prefix: {t_b / args.n_trials:8.3f} s/trial "
          f"({n_b} forwards)")
    print(f"   speed-up vs naive:  shared prefix {t_full / t_s:5.2f}x, + batching "
          f"{t_full / t_b:5.2f}x")


if __name__ == "__main__":
    main()
