"""Real-scale speed and memory: locos_tl against plain HF and an authors'-style scorer.

Builds a random-weight checkpoint of a named shape and prints, side by side, for one
trial per prompt length (each measurement in a fresh process, after a warm-up call on a
short prompt):

- ``hf_sdpa``: plain HF greedy ``generate`` with SDPA attention (the floor);
- ``authors``: an authors'-style LOCOS scorer written from the paper's description
  (SDPA prefill of the plain HF model, then eager decode steps that return attention
  rows, phi per step per layer from the KV cache's values and ``W_O``);
- ``bridge_generate``: the TransformerBridge's own ``generate`` (eager attention);
- ``locos``: ``locos_tl.score_trials`` (LOCOS, raw);
- ``five``: ``score_trials`` with all five detectors in one pass;
- ``batched``: ``score_trials(..., batch_size=8)`` on 8 trials (throughput per trial);
- ``abl_<mode>``: ``ablate`` (50 heads) + ``greedy_decode`` for each ablation mode;
- ``authors_abl``: authors'-style ablation: a forward hook on ``q_proj`` of the plain HF
  model zeroing 50 heads' query slices, SDPA throughout, HF greedy ``generate``.

Columns: wall seconds, peak memory above the loaded weights (``torch.cuda.
max_memory_allocated`` on a GPU, peak RSS growth on the CPU), and, for the scorers,
aten operations per decode step per layer and host reads (``aten::_local_scalar_dense``,
i.e. ``.item()``/``int()``/``float()`` of a device tensor) per decode step, both from
``torch.profiler`` over a few decode steps after the prefill.

Shapes: ``qwen3-8b`` (36 layers, d_model 4096, 32 query / 8 kv heads, d_head 128,
vocabulary 151,936; bf16; lengths 4k/16k/32k on a GPU) and ``small`` (4 layers,
d_model 256, 8 / 2 heads, d_head 32; float32; lengths 512/4k on the CPU).

Usage::

    python benchmarks/bench_gpu.py --shape small                 # CPU
    python benchmarks/bench_gpu.py --shape qwen3-8b --device cuda  # one H200

Needs only torch, transformers and locos_tl's scoring path (TransformerLens; plotly is
not imported).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    "qwen3-8b": dict(num_hidden_layers=36, hidden_size=4096, intermediate_size=12288,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936, max_position_embeddings=40960, dtype="bfloat16",
                     lengths="4096,16384,32768"),
    "small": dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                  vocab_size=384, max_position_embeddings=8192, dtype="float32",
                  lengths="512,4096"),
}
MODES = ("hf_sdpa", "authors", "bridge_generate", "locos", "five", "batched",
         "abl_query_mean", "abl_query_zero", "abl_output_mean", "abl_output_zero",
         "authors_abl")
N_ABLATED = 50


def build_checkpoint(shape: str, path: Path, device: str) -> Path:
    """A random-weight Qwen3 checkpoint of ``shape`` (saved with ``save_pretrained``)."""
    import torch
    import transformers

    from locos_tl.models.tiny import byte_bpe_tokenizer

    spec = {k: v for k, v in SHAPES[shape].items() if k not in ("dtype", "lengths")}
    tok = byte_bpe_tokenizer()
    cfg = transformers.Qwen3Config(tie_word_embeddings=False, initializer_range=0.02,
                                   eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id, **spec)
    dtype = getattr(torch, SHAPES[shape]["dtype"])
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


# ----------------------------------------------------------------------------- helpers
def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _mem_reset(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated() / 2**20
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _mem_peak(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _plain(ckpt: str, device: str, dtype: str, attn: str = "sdpa"):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        ckpt, attn_implementation=attn, dtype=getattr(torch, dtype)).to(device).eval()


# ------------------------------------------------------------ the authors'-style scorer
def authors_score(hf, ids, needle: tuple[int, int], new: int, eager=None, on_step=None):
    """LOCOS the way the paper describes it, on a plain HF model.

    SDPA prefill of ``ids[:-1]``; then per decode step an eager forward of one token with
    ``output_attentions=True``; phi per layer from the cache's values (after the step's
    update), ``W_O`` (``o_proj`` columns) and ``u_y`` (raw ``lm_head`` row); the
    contrast of Eq. 3 is kept per step on the device. Returns the generated ids.
    """
    import torch
    from transformers import DynamicCache

    cfg = hf.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // H
    W_O = [layer.self_attn.o_proj.weight.view(cfg.hidden_size, H, d).permute(1, 2, 0)
           for layer in hf.model.layers]  # [H, d_head, d_model]
    W_U = hf.lm_head.weight  # [vocab, d_model]
    eager = eager if eager is not None else hf
    cache = DynamicCache(config=cfg)
    s, e = needle
    n = e - s
    with torch.no_grad():
        hf(ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
        step_in = ids[:, -1:]
        out, contrasts = [], []
        for _ in range(new):
            o = eager(step_in, past_key_values=cache, use_cache=True, output_attentions=True)
            y = o.logits[0, -1].argmax()
            u = W_U[y]
            per_layer = []
            for l, attn in enumerate(o.attentions):
                v = cache.layers[l].values[0]  # [Hkv, N_t, d]
                w = W_O[l] @ u  # [H, d]
                vw = torch.einsum("gnd,ghd->ghn", v, w.view(Hkv, H // Hkv, d))
                phi = attn[0, :, 0, :] * vw.reshape(H, -1)  # [H, N_t]
                plus = phi[:, s:e].sum(-1)
                minus = (phi.sum(-1) - plus) * n / (phi.shape[-1] - n)
                per_layer.append(plus - minus)
            contrasts.append(torch.stack(per_layer))
            if on_step is not None:
                on_step()
            tok = int(y)  # the one host read per step
            out.append(tok)
            step_in = ids.new_tensor([[tok]])
        torch.stack(contrasts).float().cpu()
    return out


def authors_ablated_generate(hf, ids, heads, new: int):
    """Authors'-style query ablation: zero the heads' slices of ``q_proj``'s output."""
    import torch

    cfg = hf.config
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    handles = []
    by_layer: dict[int, list[int]] = {}
    for l, h in heads:
        by_layer.setdefault(l, []).append(h)
    for l, hs in by_layer.items():
        def hook(_m, _i, out, hs=hs):
            out = out.clone()
            for h in hs:
                out[..., h * d:(h + 1) * d] = 0
            return out
        handles.append(hf.model.layers[l].self_attn.q_proj.register_forward_hook(hook))
    try:
        with torch.no_grad():
            return hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    finally:
        for h in handles:
            h.remove()


# ------------------------------------------------------------------- one measurement
def child(ckpt: str, mode: str, n: int, new: int, device: str, dtype: str) -> None:
    import torch

    torch.manual_seed(0)
    vocab = json.loads((Path(ckpt) / "config.json").read_text())["vocab_size"]
    gen = torch.Generator().manual_seed(n)
    tokens = torch.randint(1, min(vocab, 380) - 1, (n,), generator=gen).tolist()
    plain = model = None
    if mode in ("hf_sdpa", "authors", "authors_abl"):
        plain = _plain(ckpt, device, dtype)
    else:
        import locos_tl as lt

        model = lt.load_model(ckpt, device=device, dtype=dtype)
    L = json.loads((Path(ckpt) / "config.json").read_text())["num_hidden_layers"]
    Hn = json.loads((Path(ckpt) / "config.json").read_text())["num_attention_heads"]
    heads = [(i // Hn, i % Hn) for i in range(0, L * Hn, max(1, L * Hn // N_ABLATED))]
    heads = heads[:N_ABLATED]
    means = None
    if mode in ("abl_query_mean", "abl_output_mean"):
        import locos_tl as lt

        means = lt.calibrate_means(model, [tokens[:256]], progress=False)

    def run(ids_list: list[int]) -> int:
        ids = torch.tensor([ids_list], device=device)
        m = len(ids_list)
        span = (m // 2, m // 2 + 8)
        if mode == "hf_sdpa":
            with torch.no_grad():
                plain.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
            return new
        if mode == "authors":
            return len(authors_score_switch(plain, ids, span, new))
        if mode == "authors_abl":
            authors_ablated_generate(plain, ids, heads, new)
            return new
        import locos_tl as lt

        if mode == "bridge_generate":
            with torch.no_grad():
                model.generate(ids, max_new_tokens=new, do_sample=False, verbose=False)
            return new
        trial = lt.Trial(tokens=ids_list, needle_span=span, answer="x")
        if mode == "locos":
            lt.score_trials(model, [trial], max_new_tokens=new, progress=False)
            return new
        if mode == "five":
            lt.score_methods(model, [trial], methods=list(lt.DETECTORS), max_new_tokens=new,
                             progress=False)
            return new
        if mode == "batched":
            trials = [lt.Trial(tokens=ids_list, needle_span=span, answer="x",
                               trial_id=f"b{i}") for i in range(8)]
            lt.score_trials(model, trials, max_new_tokens=new, progress=False, batch_size=8)
            return 8 * new
        if mode.startswith("abl_"):
            abl_mode = mode[4:]
            with lt.ablate(model, heads, mode=abl_mode, means=means):
                lt.greedy_decode(model, ids_list, max_new_tokens=new, stop_at_eos=False,
                                 stop_rule="none")
            return new
        raise ValueError(mode)

    try:
        run(tokens[:64])  # warm-up: kernel selection, twin build
    except TypeError as exc:  # e.g. batch_size not supported by this version
        print(json.dumps({"mode": mode, "n": n, "error": str(exc)}))
        return
    base = _mem_reset(device)
    _sync(device)
    t0 = time.perf_counter()
    run(tokens)
    _sync(device)
    wall = time.perf_counter() - t0
    out = {"mode": mode, "n": n, "wall_s": wall, "peak_mb": _mem_peak(device) - base}
    if mode in ("authors", "locos", "five"):
        out.update(profile_steps(mode, plain, model, tokens[: min(n, 512)], device, L))
    print(json.dumps(out))


def authors_score_switch(hf, ids, span, new, on_step=None):
    """Run :func:`authors_score`, switching the attention kernel between phases: SDPA
    for the prefill, eager (attention rows returned) for the decode steps."""
    cfg = hf.config

    class _Eager:
        def __call__(self, *a, **k):
            old = cfg._attn_implementation
            cfg._attn_implementation = "eager"
            try:
                return hf(*a, **k)
            finally:
                cfg._attn_implementation = old

    return authors_score(hf, ids, span, new, eager=_Eager(), on_step=on_step)


def profile_steps(mode, plain, model, tokens, device, n_layers, steps: int = 4) -> dict:
    """aten ops and host reads per decode step (per layer), from ``torch.profiler``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    counts: list[tuple[int, int]] = []
    holder: dict = {}

    def mark() -> None:  # called after each decode step's work
        prof = holder.get("prof")
        if prof is not None:
            prof.step()

    span = (len(tokens) // 2, len(tokens) // 2 + 8)
    activities = [ProfilerActivity.CPU]
    with profile(activities=activities, schedule=torch.profiler.schedule(
            wait=1, warmup=0, active=1, repeat=steps),
            on_trace_ready=lambda p: counts.append(_count(p))) as prof:
        holder["prof"] = prof
        if mode == "authors":
            ids = torch.tensor([tokens], device=device)
            authors_score_switch(plain, ids, span, steps * 2 + 1, on_step=mark)
        else:
            import locos_tl as lt
            from locos_tl.engine.decode import greedy_decode
            from locos_tl.detectors import get_detector
            from locos_tl.engine.unembed import AnswerDirections

            names = ["locos"] if mode == "locos" else list(lt.DETECTORS)
            dets = [get_detector(m) for m in names]
            dirs = AnswerDirections(model, "raw")
            trial = lt.Trial(tokens=tokens, needle_span=span, answer="x")
            acc = [d.accumulator(model, trial) for d in dets] if hasattr(
                dets[0], "accumulator") else None

            def on_step(step):
                if acc is not None:
                    for a in acc:
                        a.update(step)
                else:
                    for d in dets:
                        d.step_value(step, trial.needle_span)
                mark()
            greedy_decode(model, tokens, max_new_tokens=steps * 2 + 1, on_step=on_step,
                          directions=dirs, stop_at_eos=False, stop_rule="none")
    if not counts:
        return {}
    ops = sorted(c[0] for c in counts)[len(counts) // 2]
    reads = sorted(c[1] for c in counts)[len(counts) // 2]
    return {"aten_per_step_layer": ops / n_layers, "host_reads_per_step": reads}


def _count(prof) -> tuple[int, int]:
    ev = prof.events()
    ops = sum(1 for e in ev if e.name.startswith("aten::"))
    reads = sum(1 for e in ev if e.name == "aten::_local_scalar_dense")
    return ops, reads


# ---------------------------------------------------------------------------- driver
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--lengths", default=None, help="comma-separated prompt lengths")
    ap.add_argument("--new", type=int, default=50, help="new tokens per trial")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--ckpt", default=None, help="reuse a checkpoint directory")
    ap.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        ckpt, mode, n, new, device, dtype = args.child
        child(ckpt, mode, int(n), int(new), device, dtype)
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    spec = SHAPES[args.shape]
    ckpt = Path(args.ckpt) if args.ckpt else Path(tempfile.mkdtemp()) / args.shape
    if not (ckpt / "config.json").exists():
        t0 = time.perf_counter()
        build_checkpoint(args.shape, ckpt, "cuda" if device.startswith("cuda") else "cpu")
        print(f"built {args.shape} checkpoint in {time.perf_counter() - t0:.0f} s: {ckpt}")
    lengths = [int(x) for x in (args.lengths or spec["lengths"]).split(",")]
    modes = args.modes.split(",")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else (
        f"CPU ({os.cpu_count()} cores, OMP_NUM_THREADS="
        f"{os.environ.get('OMP_NUM_THREADS', 'default')})")
    print(f"machine: {name}; shape {args.shape}; dtype {spec['dtype']}; {args.new} new tokens")
    mem = "peak GPU MB" if device.startswith("cuda") else "peak RSS +MB"
    print(f"| mode | tokens | wall s | {mem} | aten/step/layer | host reads/step |")
    print("| --- | --- | --- | --- | --- | --- |")
    res: dict[tuple[str, int], dict] = {}
    for n in lengths:
        for mode in modes:
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(ckpt), mode, str(n), str(args.new),
                 device, spec["dtype"]], capture_output=True, text=True,
            )
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {mode} | {n} | failed: {err[:80]} | | | |", flush=True)
                continue
            r = json.loads(lines[-1])
            res[mode, n] = r
            if "error" in r:
                print(f"| {mode} | {n} | n/a ({r['error'][:60]}) | | | |", flush=True)
                continue
            ops = r.get("aten_per_step_layer")
            reads = r.get("host_reads_per_step")
            print(f"| {mode} | {n} | {r['wall_s']:.2f} | {r['peak_mb']:.0f} | "
                  f"{'' if ops is None else f'{ops:.0f}'} | "
                  f"{'' if reads is None else reads} |", flush=True)
    for n in lengths:
        a, lo, fv = res.get(("authors", n)), res.get(("locos", n)), res.get(("five", n))
        hf = res.get(("hf_sdpa", n))
        if a and lo and "wall_s" in a and "wall_s" in lo:
            line = f"{n}: LOCOS / authors time {lo['wall_s'] / a['wall_s']:.2f} (target <= 1.0)"
            if hf and "peak_mb" in hf:
                line += (f"; LOCOS / HF peak memory "
                         f"{lo['peak_mb'] / max(hf['peak_mb'], 1e-9):.2f} (target <= 1.05)")
            if fv and "wall_s" in fv:
                line += f"; five / LOCOS time {fv['wall_s'] / lo['wall_s']:.2f} (target <= 1.1)"
            print(line)
        aa = res.get(("authors_abl", n))
        for m in ("query_mean", "query_zero", "output_mean", "output_zero"):
            ab = res.get((f"abl_{m}", n))
            if aa and ab and "wall_s" in ab:
                print(f"{n}: ablated {m} / authors' ablated time "
                      f"{ab['wall_s'] / aa['wall_s']:.2f} (target <= 1.1), memory "
                      f"{ab['peak_mb'] / max(aa['peak_mb'], 1e-9):.2f} (target <= 1.05)")
        b = res.get(("batched", n))
        if a and b and "wall_s" in b:
            thr = (8 * args.new / b["wall_s"]) / (args.new / a["wall_s"])
            print(f"{n}: batched B=8 throughput / authors' {thr:.2f} (target >= 3)")


if __name__ == "__main__":
    main()
