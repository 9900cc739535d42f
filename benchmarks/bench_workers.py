"""Throughput of LOCOS scoring on 1 and 2 local Ray workers, and Ray's start-up cost.

On the shipped organism when ``data/organisms/<name>/`` exists, else on a random
4-layer Qwen3 (d_model 256, 8 heads over 2 kv heads). Prints:

- Ray start-up: ``ray.init`` of a local cluster, and the time until the first / every
  worker has imported torch and loaded the model (the fixed cost of ``--workers``);
- trials per minute with warm workers for 1 and 2 workers (each worker 1 CPU thread),
  and their ratio, which is what matters on a 2-core machine (ideal: 2.0);
- the single-process reference (no Ray) with 1 thread and with the default threads;
- the engine alone: 40 tasks that only sleep 0.1 s, on 1 and 2 workers (dispatch
  overhead and parallelism without CPU contention).

Timed rounds alternate between the warm 1-worker and 2-worker pools (the machine may be
shared); every round's scores are checked to equal the single-process scores (1 thread,
as each worker has: on CPU, exact equality needs the same thread count).

Usage: ``python benchmarks/bench_workers.py [--trials 24] [--tokens 256] [--new 8]
[--rounds 3]``
"""

# ruff: noqa: T201
from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SleepTask:
    """A task that only waits: measures the engine's parallelism without CPU contention."""

    seconds: float

    def __call__(self, host: object) -> None:
        time.sleep(self.seconds)


def _model_dir(tmp: Path) -> tuple[Path, str]:
    try:
        from locos_tl.organisms import SMALL_ORGANISM

        org = Path(SMALL_ORGANISM)
        if (org / "config.json").exists():
            return org, f"organism {org.name}"
    except ImportError:
        pass
    from locos_tl.models.tiny import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(
        "qwen3", tmp / "qwen3-4l-256", num_hidden_layers=4, hidden_size=256,
        intermediate_size=512, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=4096, initializer_range=0.02,
    )
    return ckpt, "random Qwen3 4 layers, d_model 256"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--new", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import ray
    import torch

    import locos_tl as lt
    from locos_tl.runs.distributed import ScoreSpec, ScoreTask, model_pool

    tmp = Path(tempfile.mkdtemp())
    path, label = _model_dir(tmp)
    model = lt.load_model(path, device="cpu")
    g = torch.Generator().manual_seed(0)
    n = args.tokens
    if label.startswith("organism"):  # its own tasks, half literal, half non-literal
        from locos_tl.organisms import make_trials

        half = args.trials // 2
        trials = make_trials("literal", half, n) + make_trials("nonliteral",
                                                               args.trials - half, n)
    else:  # random prompts whose gold answer is the model's own response: accepted
        trials = []
        for i in range(args.trials):
            tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (n,), generator=g).tolist()
            answer = lt.greedy_decode(model, tokens, max_new_tokens=args.new).text
            trials.append(lt.Trial(tokens=tokens, needle_span=(n // 2, n // 2 + 8),
                                   answer=answer if answer.strip() else "x", meta={"i": i}))
    spec = ScoreSpec(methods=("locos",), variant="raw", gate_threshold=-1.0,  # gate off:
                     decode=lt.DecodeOptions(max_new_tokens=args.new))  # same work a trial
    tasks = [ScoreTask(spec, t) for t in trials]
    print(f"model: {label}; {len(trials)} trials x {n} tokens, {args.new} new tokens; "
          f"{os.cpu_count()} CPUs")

    # single process, no Ray (1 thread, as each Ray worker gets; then torch's default)
    lt.greedy_decode(model, trials[0].tokens[:16], max_new_tokens=1)  # build the SDPA twin
    default_threads = torch.get_num_threads()
    single = {}
    for threads in sorted({1, default_threads}):
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        res = lt.score_trials(model, trials, max_new_tokens=args.new, gate_threshold=-1.0,
                              progress=False)
        single[threads] = time.perf_counter() - t0
        if threads == 1:
            ref = res
    torch.set_num_threads(default_threads)
    print(f"accepted trials: {ref.n_trials} of {len(trials)}")
    for threads, wall in single.items():
        print(f"single process, {threads} thread(s): {len(trials) / wall * 60:8.1f} trials/min")

    # Ray start-up: cluster, then workers importing torch and loading the model
    t0 = time.perf_counter()
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    t_init = time.perf_counter() - t0
    rates: dict[int, list[float]] = {1: [], 2: []}
    single_rates: list[float] = []
    try:
        pools = {}
        for workers in (1, 2):
            t0 = time.perf_counter()
            pools[workers] = pool = model_pool(path, workers=workers,
                                               load_kwargs={"device": "cpu"})
            pool.start()
            pool.info()
            t_first = time.perf_counter() - t0
            pool.wait_ready()
            t_all = time.perf_counter() - t0
            pool.map(tasks[:workers])  # warm-up: one trial a worker (SDPA twin)
            print(f"{workers} worker(s) started: first ready {t_first:5.1f} s, "
                  f"all ready {t_all:5.1f} s")
        for _ in range(args.rounds):  # alternate, so load from other processes hits all
            torch.set_num_threads(1)
            t0 = time.perf_counter()
            lt.score_trials(model, trials, max_new_tokens=args.new, gate_threshold=-1.0,
                            progress=False)
            single_rates.append(len(trials) / (time.perf_counter() - t0) * 60)
            torch.set_num_threads(default_threads)
            for workers, pool in pools.items():
                t0 = time.perf_counter()
                recs = pool.map(tasks)
                rates[workers].append(len(trials) / (time.perf_counter() - t0) * 60)
                got = lt.score.aggregate(recs, ["locos"], model=model, variant="raw", meta={})
                assert torch.equal(got.trial_scores, ref.trial_scores), "scores differ"
        sleeps = {}
        for workers, pool in pools.items():  # dispatch overhead and parallelism alone
            t0 = time.perf_counter()
            pool.map([SleepTask(0.1)] * 40)
            sleeps[workers] = time.perf_counter() - t0
        for pool in pools.values():
            pool.close()
    finally:
        ray.shutdown()
    print(f"single process, 1 thread, interleaved: best {max(single_rates):8.1f}, median "
          f"{statistics.median(single_rates):8.1f} trials/min")
    for workers, rs in rates.items():
        print(f"{workers} worker(s), warm: best {max(rs):8.1f}, median "
              f"{statistics.median(rs):8.1f} trials/min over {len(rs)} rounds")
    ratio = max(rates[2]) / max(rates[1])
    print(f"engine alone (40 tasks sleeping 0.1 s): 1 worker {sleeps[1]:.2f} s, 2 workers "
          f"{sleeps[2]:.2f} s -> {sleeps[1] / sleeps[2]:.2f}x")
    print(f"ray.init (local cluster): {t_init:.1f} s")
    print(f"2 workers / 1 worker throughput (best): {ratio:.2f}x (ideal 2.0)")
    print("2-worker and 1-worker scores equal the single-process (1 thread) scores: yes")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
