"""Attribution patching (AtP): a gradient estimate of CRI, every head from one backward.

Nanda 2023, "Attribution patching: activation patching at industrial scale"; AtP* in
Kramár, Lieberum, Shah & Nanda 2024 (arXiv 2403.00745). CRI
(:mod:`locos_tl.experiments.patching`) patches head ``(l, h)``'s clean ``hook_z`` into
the corrupted run and measures

    CRI(l, h) = m(corrupted with z_{l,h} := z^clean_{l,h}) - m(corrupted),
    m = logit[gold] - logit[c]   (c: the corrupted run's argmax, gold excluded)

at the position before the first answer token. AtP replaces that difference by its first
order Taylor term around the corrupted run:

    AtP(l, h) = sum_{pos, d_head} (z^clean - z^corr)[pos, h, :] * dm/dz^corr[pos, h, :]

(logits, same sign and units as CRI). It equals CRI when ``m`` is affine in that head's
``z`` (a last-layer head read through a frozen final norm and no MLP after it); else it
is the derivative of ``eps -> m(z^corr + eps (z^clean - z^corr))`` at ``eps = 0``.
Clean/corrupted pairs, gold token, counterfactual and metric are CRI's own
(:func:`~locos_tl.experiments.patching.corrupt_tokens`), so the two rank the same
quantity. Cost per trial: one forward of the clean prompt (caching ``hook_z``) and one
forward + backward of the corrupted prompt (gradients at every layer's ``hook_z``),
against CRI's ``2 + n_layers * n_heads / batch_size`` forwards. The tokens before the
first corrupted one run once (KV cache): their ``z`` is the same in both runs, so their
term is exactly 0. The corrupted run goes in one forward; its backward recomputes one
decoder layer at a time (:mod:`locos_tl.engine.recompute`) and reduces each layer's
gradient to per-head scores as soon as it exists, so memory grows linearly with the
prompt (docs/benchmarks.md).

What of AtP* is not here, and why. AtP*'s *QK fix* targets effects that
pass through an attention softmax via queries and keys, where the linearisation fails when
the softmax saturates: it recomputes that softmax exactly and linearises only after it.
The node here is ``hook_z``, after its own head's softmax (the head's pattern does not
depend on its ``z``), so there is nothing to recompute at the node; its effect reaches
``m`` through ``W_O`` and then through the later layers, whose heads see it in their
queries and keys. Recomputing those later softmaxes for each patched head is per-head
forward work, the cost of CRI itself, not a hook on ``hook_attn_scores`` /
``hook_pattern`` of one run, so it is not implemented. On the organism ``retrieval-2l``
this is where AtP falls short of CRI: the layer-0 previous-token heads act through layer
1's keys (tests/test_atp.py). *GradDrop* (against cancelling paths)
needs one more backward per layer; not implemented either. Only plain AtP is computed
(``meta["atp_variant"] = "atp"``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from locos_tl.engine.interventions import intervene
from locos_tl.engine.recompute import checkpointed_layers, frozen_cache
from locos_tl.engine.twin import sdpa_twin
from locos_tl.errors import warn_caller
from locos_tl.experiments.clean_corrupted import (
    clean_corrupted_pair,
    clean_run,
    copy_cache,
    logit_diff,
)
from locos_tl.experiments.corruption import (
    CORRUPTIONS,
    DEFAULT_FILLER,
    DEFAULT_SWAP_NAMES,
    AnswerPosition,
    Corruption,
)
from locos_tl.experiments.methods import check_trials
from locos_tl.heads import HeadScores
from locos_tl.models.load import model_dtype, model_settings
from locos_tl.runs.provenance import provenance
from locos_tl.runs.records import run_records
from locos_tl.trials import Trial, as_trial_list, trial_set_hash

Metric = Literal["logit_diff"]
RESUME_KEYS = ("model", "dtype", "method", "metric", "corruption", "answer_position",
               "max_new_tokens", "filler", "swap_names")


def atp_from_z(
    z_diff: Float[Tensor, "pos n_heads d_head"],
    grad: Float[Tensor, "pos n_heads d_head"],
) -> Float[Tensor, " n_heads"]:
    """One layer's AtP from ``z_diff = z_clean - z_corr`` (its cached ``z``) and the
    metric's gradient there: ``sum_{pos, d} z_diff * grad``, float64 (logits)."""
    return torch.einsum("phd,phd->h", z_diff.double(), grad.double())


def _grad_run(
    model: Any, ids: Int[Tensor, "1 pos"], *, start: int, cache: Any, n_layers: int,
    gold: int, z_clean: dict[int, list[Tensor]],
) -> tuple[Tensor, int, Float[Tensor, "n_layers n_heads"]]:
    """Run ``ids[:, start:]`` on ``cache`` with autograd at every ``hook_z``, take the
    gradient of the metric ``logit[gold] - logit[cf]`` (``cf``: the run's argmax, gold
    excluded), and reduce it to every head's AtP as the backward reaches each layer.

    Each hook returns ``z + s`` with ``s`` a zero scalar leaf, so the gradient reaching
    ``z + s`` is the total derivative of the metric with respect to that layer's ``z``
    (every path through later layers kept). A tensor hook there takes
    :func:`atp_from_z` with ``z_clean - z_corr`` (kept from the forward, the clean
    ``z`` dropped as soon as the difference is formed) and frees both: no layer's
    gradient outlives its reduction. On the SDPA twin (when it reproduces the hooks)
    each decoder layer runs under per-layer recomputation
    (:func:`~locos_tl.engine.recompute.checkpointed_layers`) on a frozen copy of the
    prefix cache, so memory grows with the prompt at about the residual stream's rate;
    the scores are the plain backward's, bit for bit on CPU (tests/test_atp.py). On the
    bridge (a hook the twin cannot mirror) the whole graph is kept. The forward, the
    metric and the backward all run with autograd on, whatever the caller's grad mode
    (``torch.no_grad``, ``torch.set_grad_enabled(False)``); under
    ``torch.inference_mode`` the caller (:func:`atp_trial`) has turned inference mode off.

    Args:
        z_clean: the clean run's ``hook_z`` per layer over positions ``[start, P)``, as
            ``[pos, n_heads, d_head]`` chunks; emptied as the differences are formed.

    Returns:
        ``(metric (0-d, detached), cf, AtP [n_layers, n_heads] (float64, CPU))``.
    """
    diffs: dict[int, Tensor] = {}
    leaves: dict[int, Tensor] = {}
    scores: dict[int, Tensor] = {}

    def leaf(x: Tensor, hook: Any) -> Tensor:  # [1, pos, n_heads, d_head]
        layer = int(hook.name.split(".")[1])
        if layer in leaves:  # the layer recomputed for the backward: same value, once
            return x + leaves[layer]
        diffs[layer] = torch.cat(z_clean.pop(layer)) - x[0].detach()
        leaves[layer] = torch.zeros((), dtype=x.dtype, device=x.device, requires_grad=True)
        y = x + leaves[layer]

        def reduce(grad: Tensor) -> None:
            scores[layer] = atp_from_z(diffs.pop(layer), grad[0])

        y.register_hook(reduce)
        return y

    hooks = [(f"blocks.{l}.attn.hook_z", leaf) for l in range(n_layers)]
    with torch.enable_grad(), intervene(model, hooks) as engine:
        chunk = ids[:, start:]
        twin = sdpa_twin(model) if engine == "twin" else None
        if twin is not None:
            with checkpointed_layers(twin.model.layers):
                logits = twin(chunk, past_key_values=frozen_cache(cache), use_cache=True,
                              logits_to_keep=1).logits
        else:
            logits = model(chunk, past_key_values=cache, use_cache=True, logits_to_keep=1)
        last = logits[0, -1]
        masked = last.detach().float().clone()
        masked[gold] = float("-inf")
        cf = int(masked.argmax())
        m = logit_diff(last, gold, cf)
        torch.autograd.grad(m, [leaves[l] for l in range(n_layers)])
    return m.detach(), cf, torch.stack([scores[l] for l in range(n_layers)]).cpu()


@torch.inference_mode(False)  # the backward needs tensors made outside inference mode
def atp_trial(
    model: Any,
    trial: Trial,
    *,
    corruption: Corruption = "filler",
    metric: Metric = "logit_diff",
    answer_position: AnswerPosition = "generated",
    max_new_tokens: int = 50,
    filler: str | Sequence[int] = DEFAULT_FILLER,
    swap_names: Sequence[str] = DEFAULT_SWAP_NAMES,
    chunk_size: int = 1024,
) -> dict[str, Any]:
    """AtP of every head on one trial; returns a JSON-serialisable record.

    Arguments as in :func:`atp_heads`. Record fields as
    :func:`~locos_tl.experiments.patching.cri_trial`'s: ``trial_id``, ``accepted``,
    ``dropped`` (None or ``"no_answer_step"``), ``gold``, ``counterfactual``,
    ``metric_clean``, ``metric_corrupted`` (logits), ``scores["atp"]``
    (``[n_layers][n_heads]``, logits), ``n_forwards`` (2), ``n_backwards`` (1),
    ``shared_prefix``.

    Raises:
        ValueError, TrialError: see :func:`~locos_tl.experiments.patching.corrupt_tokens`.
    """
    if metric not in get_args(Metric):
        raise ValueError(f"unknown metric {metric!r}; use one of {list(get_args(Metric))}")
    L = int(model.cfg.n_layers)
    record, pair = clean_corrupted_pair(
        model, trial, corruption, answer_position=answer_position,
        max_new_tokens=max_new_tokens, filler=filler, swap_names=swap_names)
    if pair is None:
        return record
    prefix, golds, clean, corr, shared = pair
    # the prefix before the first corrupted token runs once (its z differs by 0)
    prefix_cache, z_clean, clean_logits, gold = clean_run(
        model, clean, golds, shared=shared, chunk_size=chunk_size)
    m, cf, atp = _grad_run(model, corr, start=shared, cache=copy_cache(prefix_cache),
                           n_layers=L, gold=gold, z_clean=z_clean)  # [n_layers, n_heads]
    record.update({
        "accepted": True, "gold": gold, "counterfactual": cf, "prefix_len": len(prefix),
        "metric_clean": float(logit_diff(clean_logits, gold, cf)),
        "metric_corrupted": float(m), "scores": {"atp": atp.tolist()},
        "n_forwards": 2, "n_backwards": 1, "shared_prefix": shared,
    })
    return record


def atp_heads(
    model: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    *,
    corruption: Corruption = "filler",
    metric: Metric = "logit_diff",
    answer_position: AnswerPosition = "generated",
    max_new_tokens: int = 50,
    filler: str | Sequence[int] = DEFAULT_FILLER,
    swap_names: Sequence[str] = DEFAULT_SWAP_NAMES,
    chunk_size: int = 1024,
    out_dir: str | Path | None = None,
    progress: bool = True,
    on_resume: Callable[[int, int], None] | None = None,
) -> HeadScores:
    """Attribution-patching estimate of every head's CRI (module docstring), over trials.

    Args:
        model: a TransformerBridge.
        trials: retrieval trials.
        corruption: ``"filler"`` (default) or ``"name_swap"``, as for
            :func:`~locos_tl.experiments.patching.patch_heads`.
        metric: ``"logit_diff"``: gold minus counterfactual logit, CRI's metric.
        answer_position: ``"generated"`` (read before the first answer token of the
            clean run's greedy response; trials without the answer are dropped) or
            ``"prompt_end"`` (the last prompt token), as for CRI.
        max_new_tokens: greedy budget to find the answer (``"generated"``).
        filler, swap_names: see :func:`~locos_tl.experiments.patching.corrupt_tokens`.
        chunk_size: query positions per forward of the shared prefix and the clean run.
        out_dir: run directory (``trials.jsonl``, ``meta.json``); a rerun with the same
            settings skips finished trials.
        progress: tqdm bar over trials.
        on_resume: with ``out_dir``, called once as ``on_resume(n_reused, n_trials)``.

    Returns:
        ``HeadScores(method="atp")``: ``[n_trials, n_layers, n_heads]`` per-trial AtP in
        logits (``meta["units"]``); meta counts dropped trials.

    Raises:
        ValueError: unknown corruption, metric or answer position.
        TrialError: a bare Trial; trials that do not fit the model or cannot be
            corrupted, all named in one error before any forward pass
            (:func:`~locos_tl.experiments.methods.check_trials`).
        LocosError: ``out_dir`` holds a run with other settings or trials.

    Warns:
        RuntimeWarning: no trial was usable (every score is NaN).
    """
    if answer_position not in get_args(AnswerPosition):
        raise ValueError(f"unknown answer_position {answer_position!r}; use one of "
                         f"{list(get_args(AnswerPosition))}")
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; use one of {list(CORRUPTIONS)}")
    if metric not in get_args(Metric):
        raise ValueError(f"unknown metric {metric!r}; use one of {list(get_args(Metric))}")
    trials = as_trial_list(trials, "atp_heads")
    check_trials(model, trials, ["atp"], where="atp_heads", max_new_tokens=max_new_tokens,
                 answer_position=answer_position, corruption=corruption, filler=filler,
                 swap_names=swap_names)  # every trial, before any forward pass
    settings = {**model_settings(model), "dtype": model_dtype(model), "method": "atp",
                "metric": metric, "corruption": corruption,
                "filler": filler if isinstance(filler, str) else [int(x) for x in filler],
                "swap_names": list(swap_names), "answer_position": answer_position,
                "max_new_tokens": max_new_tokens, "n_trials": len(trials),
                "trial_set_hash": trial_set_hash(trials)}
    meta = provenance(model, settings)
    records = run_records(
        trials, lambda t: atp_trial(
            model, t, corruption=corruption, metric=metric, answer_position=answer_position,
            max_new_tokens=max_new_tokens, filler=filler, swap_names=swap_names,
            chunk_size=chunk_size),
        out_dir=out_dir, settings=settings, check_keys=RESUME_KEYS, meta=meta,
        desc="attribution patching", progress=progress, on_resume=on_resume)
    counts = {"n_trials": len(records), "n_accepted": sum(bool(r["accepted"]) for r in records),
              "n_dropped_no_answer_step": sum(r["dropped"] == "no_answer_step" for r in records)}
    if records and counts["n_accepted"] == 0:
        warn_caller(
            f"atp_heads: no usable trial: 0 of {counts['n_trials']} greedy responses hold "
            f"the answer within max_new_tokens={max_new_tokens}; every AtP score is NaN. "
            "Use trials the model answers, or answer_position='prompt_end'",
            RuntimeWarning)
    return HeadScores.from_records(
        records, "atp", n_layers=int(model.cfg.n_layers), n_heads=int(model.cfg.n_heads),
        meta={**meta, **counts, "units": "logits", "atp_variant": "atp"})

