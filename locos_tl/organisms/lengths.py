"""The organism's mechanism, re-established at each prompt length.

For every length ``T`` this module re-runs the causal criteria of
:func:`locos_tl.organisms.analysis.ground_truth` on fresh prompts of ``T`` tokens (roles
found at ``T``), ablates the *documented* role sets (those of the card's primary length)
at ``T``, and scores heads with LOCOS and the Wu copy score through the library
(:func:`locos_tl.score_methods`), so the card can state at which lengths the documented
ground truth holds:

- the non-literal writers attend to the needle landmark and write the name (patching);
- zero-ablating them drops non-literal accuracy by >= 0.5 while literal stays >= 0.8;
- the Wu copy score gives them about 0, and LOCOS ranks them among its top heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from locos_tl.organisms import analysis as A
from locos_tl.organisms.tasks import make_trials

Head = tuple[int, int]

#: The criteria the card checks at each length.
NONLIT_DROP_MIN = 0.5
LITERAL_KEEP_MIN = 0.8


def _fmt(hs: Sequence[Head]) -> str:
    return ", ".join(f"L{ly}H{h}" for ly, h in hs) or "(none)"


def detector_scores(out_dir: str | Path, n_tokens: int, n_trials: int = 24,
                    seed: int = 2024) -> dict[str, Any]:
    """LOCOS and Wu scores on ``n_trials`` non-literal trials of ``n_tokens`` tokens (at
    most the model's ``n_ctx`` - 3, leaving room for the 3 decoded tokens; library scorer
    through the TransformerBridge, raw variant).

    Returns:
        ``{"locos": HeadScores, "wu": HeadScores}`` (``.scores``: ``[n_layers, n_heads]``,
        logits for LOCOS, attention mass for Wu).
    """
    from locos_tl import load_model, score_methods

    bridge = load_model(out_dir, device="cpu")
    # the answer and </s> are all that is decoded; the prompt leaves room for them
    n_ctx = int(getattr(bridge.cfg, "n_ctx", n_tokens + 3) or n_tokens + 3)
    trials = make_trials("nonliteral", n_trials, min(n_tokens, n_ctx - 3), seed=seed)
    sc = score_methods(bridge, trials, methods=["locos", "wu"], max_new_tokens=3,
                       progress=False)
    return {m: sc[m] for m in ("locos", "wu")}


def mechanism_at(
    model: Any,
    out_dir: str | Path,
    n_tokens: int,
    documented: A.GroundTruth,
    *,
    n: int = 100,
    seed: int = 4242,
    n_detector: int = 24,
    n_attention: int = 32,
) -> dict[str, Any]:
    """Causal criteria at one length.

    Args:
        model: eager HF model (:func:`locos_tl.organisms.analysis.load_hf`).
        out_dir: its checkpoint directory (for the library's detectors).
        n_tokens: prompt length.
        documented: the card's role sets (from its primary length).
        n: prompts per task for the causal measurements.
        n_detector: non-literal trials for LOCOS / Wu.
        n_attention: prompts per task for the attention profiles (eager attention).

    Returns:
        JSON-ready record: ``roles`` found at this length, ``baseline`` accuracy,
        ``documented_ablation`` (zero-ablating each documented role set: accuracy per
        task), writers' attention to the needle landmark, LOCOS / Wu scores of the
        documented writers and LOCOS's rank of them, and ``criteria`` (booleans).
    """
    gt = A.ground_truth(model, n=n, n_tokens=n_tokens, seed=seed, single=False,
                        n_attention=n_attention)
    lit = A.examples("literal", n, n_tokens, seed)
    non = A.examples("nonliteral", n, n_tokens, seed)
    base = gt.numbers["baseline"]
    abl: dict[str, dict[str, float]] = {}
    for role in ("literal_copy", "nonliteral_writer"):
        hs = getattr(documented, role)
        if hs:
            with A.ablate_heads(model, hs, "zero"):
                abl[role] = {"literal": A.accuracy(model, lit),
                             "nonliteral": A.accuracy(model, non)}
    att = np.asarray(gt.numbers["attention_nonliteral"]["needle_landmark"])
    writers = [tuple(h) for h in documented.nonliteral_writer]
    scored = detector_scores(out_dir, n_tokens, n_detector)
    det = {m: hs.scores.numpy() for m, hs in scored.items()}
    ranked = [tuple(h) for h in scored["locos"].ranked()]  # ties broken by (layer, head)
    rank = {h: ranked.index(h) + 1 for h in writers}
    w_abl = abl.get("nonliteral_writer", {"literal": float("nan"), "nonliteral": float("nan")})
    criteria = {
        "writers_attend_landmark": bool(writers) and all(att[h] >= 0.5 for h in writers),
        "writers_found_by_patching": bool(writers)
        and set(writers) <= {tuple(h) for h in gt.nonliteral_writer},
        "ablation_drops_nonliteral": base["nonliteral"] - w_abl["nonliteral"] >= NONLIT_DROP_MIN,
        "ablation_keeps_literal": w_abl["literal"] >= LITERAL_KEEP_MIN,
        "wu_near_zero": bool(writers) and all(abs(det["wu"][h]) <= 0.05 for h in writers),
        "locos_top": bool(writers) and max(rank.values()) <= 2 * len(writers) + 4,
    }
    return {
        "n_tokens": n_tokens, "n_prompts_per_task": n, "seed": seed,
        "n_attention_prompts": n_attention,
        "roles": {"literal_copy": gt.literal_copy, "nonliteral_writer": gt.nonliteral_writer,
                  "prev_token": gt.prev_token},
        "baseline": base,
        "documented_ablation": abl,
        "writer_attention_to_landmark": {f"L{h[0]}H{h[1]}": float(att[h]) for h in writers},
        "writer_scores": {f"L{h[0]}H{h[1]}": {"locos": float(det["locos"][h]),
                                             "wu": float(det["wu"][h]),
                                             "locos_rank": rank[h]} for h in writers},
        "locos": det["locos"].tolist(), "wu": det["wu"].tolist(),
        "criteria": criteria,
    }


def mechanism_by_length(model: Any, out_dir: str | Path, lengths: Sequence[int],
                        documented: A.GroundTruth, **kw: Any) -> dict[str, Any]:
    """:func:`mechanism_at` for each length: ``{str(T): record}``."""
    return {str(T): mechanism_at(model, out_dir, T, documented, **kw) for T in lengths}


def valid_range(acc: dict[str, dict[str, float]], *, literal: float = 0.95,
                nonliteral: float = 0.90) -> dict[str, Any]:
    """Prompt lengths where greedy accuracy meets the bar on every filler measured.

    Args:
        acc: ``{"synthetic@T": {"literal": a, "nonliteral": b}, "book@T": ...}`` (the
            card's accuracy table).

    Returns:
        ``{"lengths_ok": [...], "lengths_failed": [...], "min_valid": T or None,
        "max_valid": T or None, "literal": bar, "nonliteral": bar}``: the valid range is
        the longest run of consecutive measured lengths that all pass (the shortest
        such run's first length on a tie is not preferred: the longer lengths win).
    """
    by_len: dict[int, bool] = {}
    for key, v in acc.items():
        T = int(key.split("@")[1])
        ok = v["literal"] >= literal and v["nonliteral"] >= nonliteral
        by_len[T] = by_len.get(T, True) and ok
    lengths = sorted(by_len)
    best: list[int] = []
    run: list[int] = []
    for T in lengths:
        run = [*run, T] if by_len[T] else []
        if len(run) >= len(best) and run:
            best = run
    return {"lengths_ok": [T for T in lengths if by_len[T]],
            "lengths_failed": [T for T in lengths if not by_len[T]],
            "min_valid": best[0] if best else None, "max_valid": best[-1] if best else None,
            "literal": literal, "nonliteral": nonliteral}


_HEADER = "\n".join([
    "| " + " | ".join(["tokens", "baseline lit / non-lit", "writers zero-ablated: lit / non-lit",
                       "min writer attention to landmark", "max abs Wu of writers",
                       "worst LOCOS rank", "writers found at this length", "all criteria"])
    + " |",
    "|---" * 8 + "|",
])


def lengths_section(rec: dict[str, Any], documented: A.GroundTruth) -> str:
    """Markdown: one row per length with the criteria's numbers."""
    rows = []
    for T, r in rec.items():
        ab = r["documented_ablation"].get("nonliteral_writer", {})
        att = r["writer_attention_to_landmark"]
        ws = r["writer_scores"]
        ok = all(r["criteria"].values())
        rows.append(
            f"| {T} | {r['baseline']['literal']:.2f} / {r['baseline']['nonliteral']:.2f} "
            f"| {ab.get('literal', float('nan')):.2f} / {ab.get('nonliteral', float('nan')):.2f} "
            f"| {min(att.values()) if att else float('nan'):.2f} "
            f"| {max(abs(v['wu']) for v in ws.values()) if ws else float('nan'):.3f} "
            f"| {max(v['locos_rank'] for v in ws.values()) if ws else '-'} "
            f"| {_fmt(r['roles']['nonliteral_writer'])} | {'yes' if ok else 'NO'} |")
    first = next(iter(rec.values()))
    return f"""
## The mechanism at each length
Documented non-literal writers: {_fmt(documented.nonliteral_writer)}; literal copy heads:
{_fmt(documented.literal_copy)}. At each length, {first['n_prompts_per_task']} fresh prompts
per task (seed {first['seed']}): the causal criteria re-run from scratch (writers found by
patching at that length), the documented writers zero-ablated, and LOCOS / Wu scored by
`locos_tl.score_methods` on non-literal trials. Criteria: writers put >= 0.5 of their
attention on the needle landmark, are found again by patching, their ablation drops
non-literal accuracy by >= {NONLIT_DROP_MIN} while literal stays >= {LITERAL_KEEP_MIN}, Wu
gives them |score| <= 0.05, LOCOS ranks them near the top.

{_HEADER}
{chr(10).join(rows)}
"""
