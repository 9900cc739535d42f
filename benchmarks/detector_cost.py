"""What every head-scoring detector costs on one trial, from 1k to 32k tokens.

Each detector scores the same NIAH trial (the first probe of ``niah_needles.jsonl``,
needle at 50 % depth, no chat template) at each length, beside plain Hugging Face
greedy ``generate`` with SDPA attention (the floor a user compares with):

- ``hf_generate``: ``AutoModelForCausalLM.generate``, exactly as many new tokens as a
  greedy decode of the trial makes (its stop rule, at most ``--new``);
- ``locos``, ``wu``, ``dla``, ``attention_spatial``, ``headkv``: ``score_trials(method=...)``,
  one decode pass each; ``all_decode``: the five in one ``score_methods`` call (they share
  the pass);
- ``qrhead``: :func:`~locos_tl.experiments.qrhead.qrhead_heads`;
- ``atp_prompt_end`` and ``atp``: :func:`~locos_tl.experiments.atp.atp_heads` with
  ``answer_position="prompt_end"`` and with its default (``"generated"``: the trial is
  dropped, after the greedy search, when the response lacks the answer: the note says so);
- ``cri_prompt_end`` and ``cri``: :func:`~locos_tl.experiments.patching.patch_heads` alike.

The greedy budget is ``--new`` (50, the functions' default) for every detector. The
haystack is ``dracula_part1`` (30,912 Gemma-3 tokens); where it is too short for the
longest length, the packaged books concatenated, Dracula first (the builder takes a
book's first tokens, so shorter prompts are unchanged): the output and each row's note
say which.

Every cell (detector x length) runs in a fresh process with
``MALLOC_MMAP_THRESHOLD_=65536`` (every freed block of 64 KB or more goes back to the
system, so the resident set follows the live tensors). The process loads the model, runs
the detector once on a 192-token trial (first-call costs), then on the measured trial:

- ``seconds``: wall time of the measured call;
- ``peak_growth_mb``: peak resident set during the call (``VmHWM``, reset first) minus
  the resident set before it; on CUDA ``torch.cuda.max_memory_allocated`` minus
  ``memory_allocated`` before it;
- ``forwards``, ``backwards``: passes of the model on the trial. A decode loop (the
  decode-pass methods', HF ``generate``'s, AtP's and CRI's greedy search for the answer)
  is 1 prefill plus its decode steps, counted as the one-token calls of the model's input
  embedding (the bridge's greedy decode runs a step for each generated token, HF's for
  each but the first). QRHead: 1 prefill of the context before the question plus its
  record's ``n_forwards`` (the question and the null question on forks of that cache).
  AtP and CRI: their records' ``n_forwards`` / ``n_backwards`` (the clean and corrupted
  runs, CRI's patched runs; the shared prefix before the needle runs once within them)
  plus the greedy search. A prefill in query chunks counts once.

A cell whose time, predicted from that detector's measured shorter lengths, exceeds
``--max-minutes``, or whose predicted peak growth exceeds ``--max-gb`` (default 80 % of
the memory available at the start; on a GPU, of its free memory beside the model), is
not run: its row is an estimate (``estimated=True``) from those fits. Time: a non-negative
least-squares fit of ``a + b n + c n^2`` in tokens ``n`` (``a + b n`` from two measured
lengths, ``b n`` from one); memory: ``a + b n`` alike; the note states the fit. Forward
and backward counts are the detector's at its longest measured length.

On the random shapes (``--shape qwen3-8b``: Qwen3-8B's 36 layers, d_model 4096, 32 query
and 8 kv heads of 128, MLP 12288, vocabulary 151936; ``--shape tiny``: the same code with
2 layers of d_model 64) the tokenizer is a byte-level BPE trained on the packaged books,
the unembedding rows past its vocabulary are zero (greedy decoding then emits tokens
the tokenizer can decode), and each trial's answer is the first word of the model's own
greedy response, so that AtP and CRI find an answer step as on a real model.

Writes ``OUT/detector_cost.csv`` (detector, tokens, seconds, peak_growth_mb, forwards,
backwards, estimated, device, dtype, model, note; one row per cell, written after each
cell) and ``OUT/detector_cost.html`` (+ ``.png`` when an exporter works): time and
memory against length, one line per detector, estimates as open markers on dashed lines.
Prints the table and, per detector, the memory checks: growth per token from the middle
to the largest of the three largest lengths up to 16k (8k->16k) over growth per token
below it (4k->8k; target <= 1.3), and peak growth at that largest length over HF
generation's and LOCOS's (target <= 2 each).

Usage::

    python benchmarks/detector_cost.py --out runs/detector_cost --resume
    python benchmarks/detector_cost.py --lengths 512,1024 --detectors locos,atp_prompt_end
    python benchmarks/detector_cost.py --shape tiny --lengths 256,512 --out /tmp/dc
    python benchmarks/detector_cost.py --device cuda --dtype bfloat16 --shape qwen3-8b

``--resume`` skips measured cells already in the CSV (estimates are made again);
without it the cells of this run replace theirs and other rows stay. One ``--out`` holds
one setup (shape, device, dtype, ``--new``; ``OUT/setup.json``); another is refused. The real model
must be fetched (``locos models fetch gemma-3-270m``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from detector_cost_cell import BOOK, DECODE, SHAPES, WARM_TOKENS, child, say, setup_child

DETECTORS = ("hf_generate", *DECODE, "all_decode", "qrhead", "atp_prompt_end", "atp",
             "cri_prompt_end", "cri")
REAL = "gemma-3-270m"
COLUMNS = ["detector", "tokens", "seconds", "peak_growth_mb", "forwards", "backwards",
           "estimated", "device", "dtype", "model", "note"]


# ------------------------------------------------------------------ fits (pure)
def fit(ns: list[float], ys: list[float], degree: int) -> list[float]:
    """Non-negative least-squares coefficients ``[a, b, c, ...]`` of
    ``a + b n + c n^2 + ...`` (``degree`` at most; fewer terms with fewer points: one
    point gives ``[0, y / n]``)."""
    import numpy as np
    from scipy.optimize import nnls

    if not ns:
        raise ValueError("no measured points to fit")
    if len(ns) == 1:
        return [0.0, ys[0] / ns[0]]
    deg = min(degree, len(ns) - 1)
    scale = max(ns)  # keep the columns O(1)
    x = np.asarray(ns, dtype=float) / scale
    A = np.stack([x ** k for k in range(deg + 1)], axis=1)
    coef, _ = nnls(A, np.asarray(ys, dtype=float))
    return [float(c) / scale ** k for k, c in enumerate(coef)]


def predict(coef: list[float], n: float) -> float:
    return float(sum(c * n ** k for k, c in enumerate(coef)))


def fit_text(coef: list[float], unit: str) -> str:
    terms = ["", " n", " n^2"]
    return unit + " = " + " + ".join(f"{c:.3g}{terms[k]}" for k, c in enumerate(coef))


def plan(measured: list[dict[str, Any]], n: int, max_s: float, max_mb: float
         ) -> dict[str, Any] | None:
    """None: run the cell at ``n`` tokens. Else the estimated row's figures, from the
    detector's ``measured`` rows at fewer tokens (time quadratic, memory linear in n),
    when the predicted time exceeds ``max_s`` or the predicted growth ``max_mb``."""
    pts = sorted((r for r in measured if int(r["tokens"]) < n), key=lambda r: r["tokens"])
    if not pts:
        return None
    ns = [float(r["tokens"]) for r in pts]
    t = fit(ns, [float(r["seconds"]) for r in pts], 2)
    m = fit(ns, [float(r["peak_growth_mb"]) for r in pts], 1)
    sec, mb = predict(t, n), predict(m, n)
    if sec <= max_s and mb <= max_mb:
        return None
    why = (f"time > {max_s / 60:g} min" if sec > max_s else
           f"memory > {max_mb / 1024:.1f} GB")
    return {"seconds": sec, "peak_growth_mb": mb, "forwards": pts[-1]["forwards"],
            "backwards": pts[-1]["backwards"],
            "note": (f"estimate ({why}): {fit_text(t, 'seconds')}; "
                     f"{fit_text(m, 'MB')}; fit to {','.join(str(int(x)) for x in ns)}")}


def checks(rows: list[dict[str, Any]]) -> list[str]:
    """The memory checks (module docstring) over measured rows, one line a detector."""
    mem = {(r["detector"], int(r["tokens"])): float(r["peak_growth_mb"])
           for r in rows if not _flag(r["estimated"])}
    lengths = sorted({n for _, n in mem if n <= 16000})[-3:]
    if len(lengths) < 3:
        return ["memory checks need three measured lengths up to 16000"]
    a, b, c = lengths
    out = [f"memory growth per token {b}->{c} over {a}->{b} (target <= 1.3); peak growth "
           f"at {c} over hf_generate's and locos's (target <= 2 each)"]
    for det in DETECTORS:
        if not all((det, n) in mem for n in lengths):
            continue
        low, high = (mem[det, b] - mem[det, a]) / (b - a), (mem[det, c] - mem[det, b]) / (c - b)
        ratio = f"{high / low:.2f}" if low > 0 else f"n/a ({low:.3g} MB/token below)"
        line = f"  {det:<18} per-token growth ratio {ratio}"
        for ref in ("hf_generate", "locos"):
            if (ref, c) in mem and mem[ref, c] > 0:
                line += f"; / {ref} {mem[det, c] / mem[ref, c]:.2f}"
        out.append(line)
    return out


def _flag(v: Any) -> bool:
    return v if isinstance(v, bool) else str(v).strip().lower() == "true"


# ----------------------------------------------------------------------- driver
def _child_env(threads: int) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                TOKENIZERS_PARALLELISM="false", MALLOC_MMAP_THRESHOLD_="65536")


def _run_child(args: list[str], threads: int, timeout: float | None = None
               ) -> dict[str, Any] | str:
    """The child's last JSON line, or why there is none."""
    try:
        proc = subprocess.run([sys.executable, __file__, *args], capture_output=True,
                              text=True, env=_child_env(threads), timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"stopped after {timeout:.0f} s"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return f"exit status {proc.returncode}: {tail}"
    return json.loads(lines[-1])


def read_rows(path: Path) -> list[dict[str, Any]]:
    import pandas as pd

    if not path.exists():
        return []
    df = pd.read_csv(path, keep_default_na=False)
    rows = df.to_dict("records")
    for r in rows:
        r["estimated"] = _flag(r["estimated"])
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    import pandas as pd

    tmp = path.with_suffix(".tmp")
    pd.DataFrame(rows, columns=COLUMNS).to_csv(tmp, index=False)
    tmp.replace(path)


def figure(rows: list[dict[str, Any]], stem: Path, title: str) -> str:
    """Time and peak growth against tokens, one line per detector (estimates open
    markers, dashed); writes ``stem.html`` (and ``.png`` when an exporter works)."""
    import plotly.express as px
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "wall time of the call (s)", "peak memory growth over the loaded model (MB)"))
    colors = px.colors.qualitative.Dark24
    for i, det in enumerate(d for d in DETECTORS if any(r["detector"] == d for r in rows)):
        pts = sorted((r for r in rows if r["detector"] == det), key=lambda r: r["tokens"])
        meas = [r for r in pts if not r["estimated"]]
        est = [r for r in pts if r["estimated"]]
        bridge = meas[-1:] + est  # dashed from the last measured point
        for col, key in ((1, "seconds"), (2, "peak_growth_mb")):
            style = dict(legendgroup=det, row=1, col=col)
            fig.add_scatter(x=[r["tokens"] for r in meas], y=[r[key] for r in meas],
                            mode="lines+markers", name=det, showlegend=col == 1,
                            line=dict(color=colors[i % len(colors)]), **style)
            if est:
                fig.add_scatter(x=[r["tokens"] for r in bridge], y=[r[key] for r in bridge],
                                mode="lines+markers", name=f"{det} (estimate)",
                                showlegend=False, line=dict(color=colors[i % len(colors)],
                                                            dash="dash"),
                                marker=dict(symbol=["circle"] * (len(bridge) - len(est))
                                            + ["circle-open"] * len(est),
                                            size=[6] * (len(bridge) - len(est))
                                            + [9] * len(est)), **style)
    fig.update_xaxes(type="log", title_text="prompt tokens")
    fig.update_yaxes(type="log", row=1, col=1)
    fig.update_layout(width=1200, height=500, template="plotly_white", title=title,
                      title_font_size=13)
    from figures import save_figure  # beside this script

    return save_figure(fig, stem, fmt="html", width=1200, height=500)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="1000,4000,8000,16000,32000")
    ap.add_argument("--detectors", default=",".join(DETECTORS))
    ap.add_argument("--shape", default=REAL, choices=[REAL, *SHAPES],
                    help=f"{REAL}: the real model; else a random-init Qwen3 of that shape")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per cell (CPU)")
    ap.add_argument("--new", type=int, default=50,
                    help="greedy budget (max_new_tokens; the library's default)")
    ap.add_argument("--max-minutes", type=float, default=30.0)
    ap.add_argument("--max-gb", type=float, default=None,
                    help="predicted peak growth above which a cell is estimated (default: "
                         "80 %% of the memory available at the start, or of the GPU's "
                         "free memory beside the model)")
    ap.add_argument("--out", default="runs/detector_cost")
    ap.add_argument("--resume", action="store_true", help="skip measured cells in the CSV")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--setup-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    lengths = sorted(int(x) for x in args.lengths.split(","))
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return
    if args.setup_child:
        setup_child(Path(args.setup_child), args.shape, args.device, args.dtype, lengths, args.new)
        return
    dets = [d for d in args.detectors.split(",") if d]
    if unknown := sorted(set(dets) - set(DETECTORS)):
        ap.error(f"unknown detectors {unknown}; use {','.join(DETECTORS)}")
    if min(lengths) <= WARM_TOKENS:
        ap.error(f"lengths must exceed the {WARM_TOKENS}-token warm-up trial")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    r = _run_child(["--setup-child", str(out), "--shape", args.shape, "--device",
                    args.device, "--dtype", args.dtype, "--lengths", args.lengths,
                    "--new", str(args.new)], args.threads)
    if isinstance(r, str):
        sys.exit(f"setup failed: {r}")
    setup = json.loads((out / "setup.json").read_text())
    max_mb = args.max_gb * 1024 if args.max_gb else 0.8 * _free_mb(setup)
    label, csv = setup["label"], out / "detector_cost.csv"
    same = {"device": args.device, "dtype": args.dtype, "model": label}
    hay = {setup["trials"][str(n)]["haystack"] for n in lengths}
    say(f"{label}, {args.device}, {args.dtype}, {args.threads} thread(s); prompts of "
        f"{lengths} tokens; haystack {', '.join(sorted(hay))}"
        + ("" if hay == {BOOK} else f" ({BOOK} alone is too short: the packaged books "
           "concatenated)"))
    say("greedy response holds the answer: " + ", ".join(
        f"{n} {'yes' if setup['trials'][str(n)]['answered'] else 'no'}" for n in lengths))
    rows, failed = read_rows(csv), set()

    def mine(r: dict[str, Any]) -> bool:
        return all(str(r[k]) == v for k, v in same.items())

    for n in lengths:
        for det in dets:
            if det in failed:
                say(f"{det:<18}{n:>7}  skipped: failed at a shorter length")
                continue
            old = [r for r in rows if mine(r) and r["detector"] == det]
            if args.resume and any(int(r["tokens"]) == n and not r["estimated"] for r in old):
                continue
            measured = [r for r in old if not r["estimated"]]
            cell = {"detector": det, "tokens": n, **same}
            est = plan(measured, n, args.max_minutes * 60, max_mb)
            if est is None:
                res = _run_child(["--child", str(out / "setup.json"), det, str(n)],
                                 args.threads, timeout=max(args.max_minutes * 180, 600))
                if isinstance(res, str):
                    say(f"{det:<18}{n:>7}  FAILED: {res}")
                    failed.add(det)
                    continue
                cell.update(res, estimated=False)
            else:
                cell.update(est, estimated=True)
            cell["note"] = "; ".join(x for x in (
                cell["note"], f"{args.threads} thread(s)" if args.device == "cpu" else "",
                f"haystack {setup['trials'][str(n)]['haystack']}") if x)
            rows = [r for r in rows if not (mine(r) and r["detector"] == det
                                            and int(r["tokens"]) == n)] + [cell]
            write_rows(csv, rows)
            say(f"{det:<18}{n:>7}  {cell['seconds']:9.1f} s {cell['peak_growth_mb']:9.0f} MB"
                f"  fwd {cell['forwards']} bwd {cell['backwards']}"
                + ("  (estimate)" if cell["estimated"] else ""))
    report(rows, mine, out, label, args)


def _free_mb(setup: dict[str, Any]) -> float:
    """MB available to a cell's growth: the GPU's free memory beside the loaded model
    (the setup child read it), else the memory available now."""
    if setup.get("gpu_mb"):
        return float(setup["gpu_mb"])
    with open("/proc/meminfo") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable")) / 1024


def report(rows: list[dict[str, Any]], mine: Any, out: Path, label: str, args: Any) -> None:
    """Print the table and the memory checks; write the figure."""
    import pandas as pd

    rows = [r for r in rows if mine(r)]
    if not rows:
        sys.exit("no measurements")
    df = pd.DataFrame(rows, columns=COLUMNS).sort_values(["tokens", "detector"])
    say(df.drop(columns=["device", "dtype", "model", "note"]).to_string(
        index=False, float_format=lambda v: f"{v:.1f}"))
    for line in checks(rows):
        say(line)
    say("figure:", figure(rows, out / "detector_cost",
                          f"{label} ({args.device}, {args.dtype}): one NIAH trial per "
                          "length; open markers on dashed lines are estimates"))


if __name__ == "__main__":
    main()
