"""Speed and memory on a real model: SmolLM2-135M-Instruct at 1k and 2k tokens.

Four ways to do the work of one trial, each measured in a fresh process:

- ``hf_generate``: plain Hugging Face greedy ``generate`` (``AutoModelForCausalLM`` with
  SDPA attention, the floor a user compares with);
- ``authors``: an authors'-style LOCOS scorer on the plain HF model
  (:func:`bench_gpu.authors_score_switch`: SDPA prefill, then one eager forward per
  generated token with ``output_attentions=True``; phi per layer from the full attention
  rows, the KV cache's values, ``W_O`` and the ``lm_head`` row of the token);
- ``score``: ``locos_tl.score_trials`` (LOCOS, raw variant);
- ``ablated``: ``lt.ablation_sweep``-style greedy decoding under
  ``lt.ablate(model, heads, "query_mean", means=...)`` (20 random heads, means calibrated
  once on 8 book passages of 512 tokens).

The prompt is a NIAH trial (the first probe of ``niah_needles.jsonl`` in *Dracula*, needle
at 50 % depth, SmolLM2's chat template) of exactly 1024 and 2048 tokens. ``score`` decodes
until its stop rule (newline or end of sequence, at most ``--new`` tokens); the other
three decode exactly as many tokens as it did, so every mode reads the same prompt and
writes the same number of tokens. Every mode first runs once on the prompt's first 64
tokens (kernel selection, twin build, lazy imports), then once on the whole prompt.

Memory figures (Linux ``/proc/self/status``; ``tracemalloc`` does not see torch):

- **peak MB**: the measuring process's peak resident set
  (``VmHWM``: loading, warm-up and the measured call included) minus its resident set
  after the imports every mode shares. Every child imports the same modules first
  (torch, transformers, TransformerLens, locos_tl's scoring/decoding/ablation modules,
  scipy.stats, rouge-score, pandas), so library code is excluded from every mode alike
  and the figure counts the model, the tokenizer, the engines and their working memory.
  Both engines load model and tokenizer from the same cached checkpoint directory
  (``lt.load_model("smollm2-135m-instruct")`` and ``from_pretrained`` of the directory
  it resolves to).
- **call MB**: peak resident set during the measured call minus the resident set just
  before it (the call's working memory: KV cache, activations, logits, phi).
- Both are measured twice: with glibc's default allocator settings (what a user gets;
  its dynamic mmap threshold keeps freed blocks of up to 32 MB in the heap, so
  identical runs differ by tens of MB: the median of every run is reported, with the
  range), and **live** (``MALLOC_MMAP_THRESHOLD_=65536`` in the child: every block of
  64 KB or more is returned to the system when freed, so the resident set follows the
  live tensors and repeated runs agree within a few MB). The memory target (at most
  1.05x HF ``generate``) is checked on both.
- ``--diagnose`` prints where memory goes: the import cost of TransformerLens and of
  locos_tl's scoring dependencies on top of a loaded HF model (not in peak MB), whether
  the twins and ``W_U`` share the model's tensors, tokenizer loads, the prefill's logits,
  KV-cache bytes and tensors left alive after scoring.

Timings are the measured call's wall seconds and its process CPU seconds
(``time.process_time``, all threads) with ``--threads`` torch threads (default 1). With
one thread the CPU seconds are the work itself and change little when other processes
share the cores, while wall seconds grow with the load; the ratios use the fastest of
``--time-reps`` runs. Timings are taken when the 1-minute load average is below
``--max-load`` (default 2.5; the script waits up to ``--max-wait`` seconds in all); a
timing taken after the wait ran out is marked ``under load`` in the table and the CSV.

Results are appended per measurement to ``OUT/results.jsonl`` (rerunning skips finished
measurements); the table is printed and written to ``docs/img/bench_real_smollm2.csv``,
the figure to ``docs/img/bench_real_smollm2.html`` and ``.png`` (kaleido when installed,
else headless Chromium through ``docs/scripts/render_figures.py``; HTML only, said so,
when neither works).

Usage::

    python benchmarks/bench_real.py [--lengths 1024,2048] [--out runs/bench_real]
    python benchmarks/bench_real.py --diagnose

Needs the model fetched (``locos models fetch smollm2-135m-instruct``) and the book text
shipped with locos_tl (``locos_tl/data``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_real_common import MODEL, ROOT, WARM_TOKENS, _reset_peak, _status

MODES = ("hf_generate", "authors", "score", "ablated")
FIG = ROOT / "docs" / "img" / "bench_real_smollm2"
N_HEADS_ABLATED = 20


# ------------------------------------------------------------------------ imports
def _common_imports() -> None:
    """The modules every child imports before its memory baseline."""
    import pandas  # noqa: F401
    import rouge_score.rouge_scorer  # noqa: F401
    import scipy.stats  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformer_lens import TransformerBridge  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: F401

    import locos_tl.engine.ablation  # noqa: F401
    import locos_tl.engine.decode  # noqa: F401
    import locos_tl.experiments.evaluate  # noqa: F401
    import locos_tl.experiments.score  # noqa: F401


def _bench_gpu() -> Any:
    """``benchmarks/bench_gpu.py`` as a module (its authors'-style scorer)."""
    spec = importlib.util.spec_from_file_location("bench_gpu", Path(__file__).with_name(
        "bench_gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


# ------------------------------------------------------------------- one measurement
def child(mode: str, n: int, setup_path: str) -> None:
    """Load, warm up, run ``mode`` on the ``n``-token trial; print one JSON line."""
    _common_imports()
    authors = _bench_gpu().authors_score_switch if mode == "authors" else None
    import torch

    import locos_tl as lt

    setup = json.loads(Path(setup_path).read_text())
    trial = setup["trials"][str(n)]
    new = int(setup["n_new"][str(n)])
    ids_all = list(trial["tokens"])
    base = _status("VmRSS")
    _reset_peak()
    if mode in ("hf_generate", "authors"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        ckpt = setup["checkpoint"]
        hf = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="sdpa").eval()
        AutoTokenizer.from_pretrained(ckpt)  # a user needs it to make the prompt
    else:
        model = lt.load_model(MODEL, device="cpu")
        heads = [tuple(h) for h in setup["heads"]]
        means = lt.AblationMeans.load(setup["means"]) if mode == "ablated" else None

    def run(ids: list[int]) -> int:
        if mode == "hf_generate":
            with torch.no_grad():
                out = hf.generate(torch.tensor([ids]), max_new_tokens=new,
                                  min_new_tokens=new, do_sample=False)
            return int(out.shape[1] - len(ids))
        if mode == "authors":
            m = len(ids)
            span = tuple(trial["needle_span"]) if m == len(ids_all) else (m // 4, m // 4 + 8)
            return len(authors(hf, torch.tensor([ids]), span, new))
        if mode == "score":
            m = len(ids)
            span = tuple(trial["needle_span"]) if m == len(ids_all) else (m // 4, m // 4 + 8)
            t = lt.Trial(tokens=ids, needle_span=span, answer=trial["answer"])
            lt.score_trials(model, [t], max_new_tokens=int(setup["max_new"]), progress=False)
            return new  # counted by make_setup from the same call's record
        with lt.ablate(model, heads, "query_mean", means=means):
            res = lt.greedy_decode(model, ids, max_new_tokens=new, stop_at_eos=False,
                                   stop_rule="none")
        return len(res.generated)

    run(ids_all[:WARM_TOKENS])
    load_peak = _status("VmHWM")
    before = _status("VmRSS")
    _reset_peak()
    load1 = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    generated = run(ids_all)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    call_peak = _status("VmHWM")
    print(json.dumps({
        "mode": mode, "n": n, "wall_s": wall, "cpu_s": cpu, "generated": generated,
        "peak_mb": max(load_peak, call_peak) - base, "call_mb": call_peak - before,
        "loaded_mb": before - base, "load1_before": load1,
        "load1_after": os.getloadavg()[0], "threads": torch.get_num_threads(),
    }))


# -------------------------------------------------------------------------- setup
def make_setup(out: Path, lengths: list[int], max_new: int) -> dict[str, Any]:
    """Trials, calibration means, ablated heads and the number of tokens ``score``
    generates per length (``OUT/setup.json``; reused when present)."""
    path = out / "setup.json"
    if path.exists():
        setup = json.loads(path.read_text())
        if all(str(n) in setup["trials"] for n in lengths) and setup["max_new"] == max_new:
            return setup
    import locos_tl as lt
    from locos_tl.models.zoo import resolve_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    model = lt.load_model(MODEL, device="cpu")
    from locos_tl.data.packaged import book_path, niah_probes_path

    hay = lt.load_haystacks([book_path("dracula_part1")])
    probes = lt.load_niah_probes(niah_probes_path())
    trials, n_new = {}, {}
    for n in lengths:
        tr = lt.build_niah_trials(model.tokenizer, probes[:1], hay, lengths=[n], depths=[50],
                                  num_examples=1, chat_template=True, seed=0)[0]
        trials[str(n)] = {"tokens": list(tr.tokens), "needle_span": list(tr.needle_span),
                          "answer": tr.answer}
        run_dir = out / f"setup_score_{n}"
        lt.score_trials(model, [tr], max_new_tokens=max_new, progress=False, out_dir=run_dir)
        rec = json.loads((run_dir / "trials.jsonl").read_text().splitlines()[0])
        n_new[str(n)] = len(rec["generated"])
    book = book_path("mohicans_part1").read_text(encoding="utf-8")
    ids = model.tokenizer(book, add_special_tokens=False)["input_ids"]
    prompts = [ids[i * 512:(i + 1) * 512] for i in range(8)]
    means = lt.calibrate_means(model, prompts, max_tokens=512)
    means.save(out / "means.safetensors")
    cfg = model.cfg
    heads = lt.random_heads(int(cfg.n_layers), int(cfg.n_heads), N_HEADS_ABLATED, seed=0)
    setup = {"checkpoint": str(resolve_checkpoint(MODEL)), "trials": trials, "n_new": n_new,
             "max_new": max_new, "means": str(out / "means.safetensors"),
             "heads": [list(h) for h in heads]}
    path.write_text(json.dumps(setup))
    return setup


# --------------------------------------------------------------------------- driver
def _run_child(args: list[str], threads: int, live: bool = False) -> dict[str, Any] | str:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false")
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    if live:  # glibc returns every freed block >= 64 KB: RSS follows the live tensors
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1])


def _wait_quiet(max_load: float, deadline: float) -> bool:
    """Sleep until the 1-minute load average is below ``max_load``; False when the
    deadline passed first."""
    while os.getloadavg()[0] >= max_load:
        if time.time() >= deadline:
            return False
        time.sleep(20)
    return True


def _load_results(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def summarize(results: list[dict[str, Any]], lengths: list[int]) -> Any:
    """One row per (mode, tokens): median peak and call MB over the runs with glibc's
    default settings (``mem`` and ``time`` phases) and over the ``live`` runs, the
    fastest quiet timing (or the fastest under load, flagged)."""
    import pandas as pd

    rows = []
    for n in lengths:
        for mode in MODES:
            every = [r for r in results if r["mode"] == mode and r["n"] == n]
            rs = [r for r in every if r["phase"] != "live"]
            live = [r for r in every if r["phase"] == "live"]
            if not rs or not live:
                continue
            timed = [r for r in rs if r["phase"] == "time"]
            quiet = [r for r in timed if r["quiet"]]
            best = min(quiet or timed, key=lambda r: r["wall_s"]) if timed else None
            cpu = min((r["cpu_s"] for r in (quiet or timed)), default=float("nan"))
            rows.append({
                "mode": mode, "tokens": n, "new_tokens": rs[0]["generated"],
                "wall_s": best["wall_s"] if best else float("nan"), "cpu_s": cpu,
                "timing": ("quiet" if quiet else "under load") if best else "none",
                "load1_at_timing": best["load1_launch"] if best else float("nan"),
                "peak_mb": statistics.median(r["peak_mb"] for r in rs),
                "call_mb": statistics.median(r["call_mb"] for r in rs),
                "peak_mb_min": min(r["peak_mb"] for r in rs),
                "peak_mb_max": max(r["peak_mb"] for r in rs), "n_runs": len(rs),
                "peak_live_mb": statistics.median(r["peak_mb"] for r in live),
                "call_live_mb": statistics.median(r["call_mb"] for r in live),
                "n_live_runs": len(live),
            })
    return pd.DataFrame(rows)


def ratios(df: Any) -> list[str]:
    lines = []
    for n in sorted(set(df["tokens"])):
        d = df[df["tokens"] == n].set_index("mode")
        if "hf_generate" not in d.index:
            continue
        hf = d.loc["hf_generate"]
        for mode in ("score", "ablated"):
            if mode not in d.index:
                continue
            m = d.loc[mode]
            line = (f"{n}: {mode} / HF generate: time {m.wall_s / hf.wall_s:.2f} wall, "
                    f"{m.cpu_s / hf.cpu_s:.2f} CPU; peak "
                    f"memory {m.peak_live_mb / hf.peak_live_mb:.3f} live, "
                    f"{m.peak_mb / hf.peak_mb:.3f} glibc default (target <= 1.05); call "
                    f"memory {m.call_live_mb / hf.call_live_mb:.2f} live, "
                    f"{m.call_mb / hf.call_mb:.2f} default")
            if mode == "score" and "authors" in d.index:
                a = d.loc["authors"]
                line += (f"; score / authors' time {m.wall_s / a.wall_s:.2f} wall, "
                         f"{m.cpu_s / a.cpu_s:.2f} CPU")
            lines.append(line)
    return lines


def figure(df: Any, note: str) -> str:
    """Write the figure (HTML, and PNG when an exporter works); returns what was written."""
    from plotly.subplots import make_subplots

    colors = {"hf_generate": "#4c72b0", "authors": "#dd8452", "score": "#55a868",
              "ablated": "#c44e52"}
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "CPU time of the call (s, 1 thread)", "peak memory, live (MB)",
        "peak memory, glibc default (MB; median, range)"))
    for mode in MODES:
        d = df[df["mode"] == mode]
        if d.empty:
            continue
        x = [f"{n} tokens" for n in d["tokens"]]
        fig.add_bar(x=x, y=d["cpu_s"], name=mode, marker_color=colors[mode],
                    legendgroup=mode, row=1, col=1)
        fig.add_bar(x=x, y=d["peak_live_mb"], name=mode, marker_color=colors[mode],
                    legendgroup=mode, showlegend=False, row=1, col=2)
        fig.add_bar(x=x, y=d["peak_mb"], name=mode, marker_color=colors[mode],
                    legendgroup=mode, showlegend=False, row=1, col=3,
                    error_y=dict(type="data", symmetric=False,
                                 array=d["peak_mb_max"] - d["peak_mb"],
                                 arrayminus=d["peak_mb"] - d["peak_mb_min"]))
    fig.update_layout(barmode="group", width=1200, height=440, template="plotly_white",
                      title=f"SmolLM2-135M-Instruct (float32, CPU): {note}",
                      title_font_size=13, margin={"t": 80})
    from figures import save_figure

    return save_figure(fig, FIG, fmt="html", width=1200, height=440)


# ------------------------------------------------------------------------ diagnosis
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1024,2048")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench_real"))
    ap.add_argument("--new", type=int, default=16, help="score's max_new_tokens")
    ap.add_argument("--mem-reps", type=int, default=3, help="memory runs per cell (any load)")
    ap.add_argument("--live-reps", type=int, default=2,
                    help="memory runs per cell with MALLOC_MMAP_THRESHOLD_=65536 (any load)")
    ap.add_argument("--time-reps", type=int, default=2, help="timed runs per cell (quiet)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-load", type=float, default=2.5)
    ap.add_argument("--max-wait", type=float, default=2400, help="seconds, all timings")
    ap.add_argument("--diagnose", action="store_true", help="print where memory goes")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--diagnose-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, n, setup_path = args.child
        child(mode, int(n), setup_path)
        return
    if args.diagnose_child:
        from bench_real_diagnose import diagnose_child  # beside this script

        diagnose_child(args.diagnose_child)
        return
    lengths = [int(x) for x in args.lengths.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        ap.error(f"unknown modes {unknown}; use {','.join(MODES)}")
    out = Path(args.out)
    setup = make_setup(out, lengths, args.new)
    print(f"{MODEL}; prompts of {lengths} tokens; new tokens {setup['n_new']}; "
          f"{args.threads} thread(s); CPU, float32", flush=True)
    if args.diagnose:
        r = _run_child(["--diagnose-child", str(out / "setup.json")], args.threads)
        if isinstance(r, str):
            sys.exit(f"diagnosis failed: {r}")
        for k, v in r.items():
            print(f"  {k:40s} {v:.1f}" if isinstance(v, float) else f"  {k:40s} {v}")
        (out / "diagnosis.json").write_text(json.dumps(r, indent=1))
        return
    res_path = out / "results.jsonl"
    results = _load_results(res_path)
    done = {(r["phase"], r["mode"], r["n"], r["rep"]) for r in results}
    phases = (("mem", args.mem_reps), ("live", args.live_reps), ("time", args.time_reps))
    todo = [(ph, m, n, k) for ph, reps in phases
            for n in lengths for m in modes for k in range(reps)
            if (ph, m, n, k) not in done]
    deadline = time.time() + args.max_wait
    for phase, mode, n, rep in todo:
        quiet = True
        if phase == "time":
            quiet = _wait_quiet(args.max_load, deadline)
        load_launch = os.getloadavg()[0]
        r = _run_child(["--child", mode, str(n), str(out / "setup.json")], args.threads,
                       live=phase == "live")
        if isinstance(r, str):
            print(f"{phase} {mode} {n}: failed: {r}", flush=True)
            continue
        r.update(phase=phase, rep=rep, load1_launch=load_launch,
                 quiet=bool(quiet and load_launch < args.max_load))
        with res_path.open("a") as f:
            f.write(json.dumps(r) + "\n")
        results.append(r)
        print(f"{phase:4s} {mode:12s} {n:5d}  wall {r['wall_s']:6.2f} s  cpu "
              f"{r['cpu_s']:6.2f} s  peak "
              f"{r['peak_mb']:6.0f} MB  call {r['call_mb']:5.0f} MB  new {r['generated']}  "
              f"load {load_launch:.1f}", flush=True)
    df = summarize(results, lengths)
    if df.empty:
        sys.exit("no measurements")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    for line in ratios(df):
        print(line)
    FIG.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(str(FIG) + ".csv", index=False)
    timing = set(df["timing"])
    note = (f"timings quiet (load < {args.max_load:.1f})" if timing == {"quiet"} else
            f"timings taken UNDER LOAD (the load average never fell below {args.max_load:.1f})")
    print(note)
    print("figure:", figure(df, f"{args.threads} thread(s); {note}"))


if __name__ == "__main__":
    main()
