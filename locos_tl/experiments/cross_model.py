"""Cross-model activation patching of MLP writes: at which positions and layers does a
fine-tuned model's MLP change make its answer?

A *donor* is the *base* with other MLP weights (the elicited ``smollm2-135m-nolima``:
SmolLM2-135M-Instruct with LoRA-merged MLPs, attention, norms and embeddings bit-equal).
Its config must agree with the base's on everything outside the MLPs that computes (RoPE,
sliding windows, norm eps, attention scaling, ...; :func:`config_differences`).
For a distractor trial, run the donor on the teacher-forced batch of
:func:`locos_tl.experiments.margin.name_logprobs` (prompt + each candidate name) and keep
every layer's MLP write into the residual stream, ``blocks.{l}.hook_mlp_out`` (after a
post-MLP norm where there is one); rerun the base with the donor's writes substituted at
positions ``P`` of every row and layers ``S``:

    m(P, S) = margin of the base with  mlp_out[l, p] <- mlp_out_donor[l, p],  l in S, p in P

``margin = log P(target) - max_d log P(name_d)`` (nats; :mod:`locos_tl.experiments.margin`,
the same token ids, batch and log-probabilities as the rest of the package) and
``target_logprob = log P(target)``. With ``P`` every position and ``S`` every layer the
base's residual stream is the donor's at every point (only MLP weights differ), so
``m = m_donor``; with ``P`` empty ``m = m_base``; a position after the answer position
changes nothing at or before it (causal attention). The fraction of the donor's gain a
patch recovers is ``(m(P, S) - m_base) / (m_donor - m_base)``.

Cross-model activation patching: Prakash et al. 2024, "Fine-Tuning Enhances Existing
Mechanisms" (ICLR, arXiv 2402.14811, Sec. 5, CMAP: fine-tuned activations patched into
the base model); the position-restricted, per-layer sweep follows causal tracing (Meng
et al. 2022, arXiv 2202.05262).

Positions (``positions``): ``"question"`` (the trial's question tokens,
:func:`locos_tl.experiments.qrhead.question_span`), ``"needle"`` (``Trial.needle_span``),
``"both"``, ``"prompt"`` (every prompt position), ``"all"`` (the prompt and the
teacher-forced name tokens), ``"none"`` (hooks attached, nothing written: the base), or an
explicit ``(start, end)`` span of the teacher-forced sequence.

Cost per trial: ``2 + n_sets * (1 + n_layers with layers="each")`` forwards of a batch of
``1 + n_distractors`` rows of ``N + longest name - 1`` tokens, through the bridge (hooks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from locos_tl.errors import LocosError, TrialError, warn_caller
from locos_tl.experiments.margin import candidate_token_ids, margin_of_logprobs, name_logprobs
from locos_tl.experiments.qrhead import question_span
from locos_tl.experiments.stats import bootstrap_ci, check_confidence
from locos_tl.runs.runner import check_trials_fit
from locos_tl.tokenize import tokenizer_fingerprint
from locos_tl.trials import Trial, as_span, as_trial_list

Layers = Literal["all", "each"]
POSITION_LABELS = ("question", "needle", "both", "prompt", "all", "none")
COLUMNS = ["trial_id", "positions", "layer", "n_positions", "margin", "target_logprob",
           "base_margin", "base_target_logprob", "donor_margin", "donor_target_logprob",
           "recovered"]
HookFn = Callable[[Tensor, Any], Tensor | None]
#: Hugging Face config fields (at any nesting level) in which a donor may differ from its
#: base: provenance and dtype labels (the weights are compared themselves), output flags,
#: special-token ids (the tokenizers are compared themselves), the init scale, and the MLP
#: activation (the patched write replaces what the MLP computes). Every other difference,
#: a field unknown here included, is refused by :func:`config_differences`.
HARMLESS_FIELDS = frozenset({
    "_name_or_path", "_model_name_or_path", "_commit_hash", "transformers_version",
    "architectures", "dtype", "torch_dtype",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict",
    "id2label", "label2id", "problem_type",
    "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id",
    "initializer_range",
    "hidden_act", "hidden_activation",
})
#: RoPE types whose frequencies do not read ``max_position_embeddings`` (transformers
#: ``modeling_rope_utils``; "dynamic", "yarn" and "longrope" scale by it).
ROPE_WITHOUT_MAX_POSITIONS = frozenset({"default", "linear"})
_ABSENT = object()


def _leaves(d: Mapping[Any, Any], path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every non-dict value of a nested dict, keyed by its path of keys."""
    out: dict[tuple[str, ...], Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(_leaves(v, (*path, str(k))))
        else:
            out[(*path, str(k))] = v
    return out


def _rope_types(leaves: dict[tuple[str, ...], Any]) -> set[Any]:
    return {v for p, v in leaves.items()
            if p[-1] == "rope_type" or p[-2:] == ("rope_scaling", "type")} or {"default"}


def config_differences(base_config: Any, donor_config: Any,
                       n_tokens: int | None = None) -> list[str]:
    """The differences between two Hugging Face configs that may change what attention, the
    norms or the positions compute, so that patching every MLP write could not reproduce
    the donor.

    A field may differ when it is in :data:`HARMLESS_FIELDS` (or nested under one), and
    ``max_position_embeddings`` when every RoPE type of both is in
    :data:`ROPE_WITHOUT_MAX_POSITIONS` and both are at least ``n_tokens`` (when given);
    anything else is a difference, a field present in one config only included.

    Args:
        base_config, donor_config: ``PretrainedConfig`` objects (``model.config``).
        n_tokens: the longest sequence the pair will run, tokens.

    Returns:
        One ``"field: base value vs donor value"`` string per difference, nested fields
        dotted (``rope_parameters.sliding_attention.rope_theta``), sorted; empty when the
        configs agree on everything that computes.
    """
    a, b = _leaves(base_config.to_dict()), _leaves(donor_config.to_dict())
    rope = _rope_types(a) | _rope_types(b)
    out = []
    for path in sorted(a.keys() | b.keys()):
        x, y = a.get(path, _ABSENT), b.get(path, _ABSENT)
        if x == y or HARMLESS_FIELDS.intersection(path):
            continue
        why = ""
        if path[-1] == "max_position_embeddings":
            if not rope <= ROPE_WITHOUT_MAX_POSITIONS:
                why = f" (RoPE type {sorted(map(str, rope))} reads it)"
            elif not all(isinstance(v, int) for v in (x, y)):
                why = " (absent on one side)"
            elif n_tokens is not None and n_tokens > min(x, y):
                why = f" (below the {n_tokens}-token sequence)"
            else:
                continue
        show = ["absent" if v is _ABSENT else repr(v) for v in (x, y)]
        out.append(f"{'.'.join(path)}: {show[0]} vs {show[1]}{why}")
    return out


def check_pair(base: Any, donor: Any, n_tokens: int | None = None) -> None:
    """Refuse two bridges that are not the same architecture and tokenizer, or whose
    configs differ in what attention, the norms or the positions compute
    (:func:`config_differences`: RoPE theta or scaling, sliding windows and layer types,
    norm eps, attention scaling, softcapping, ...); warn when weights outside the MLPs
    differ (patching every MLP write then cannot reproduce the donor either). Runs no
    forward pass.

    Args:
        base, donor: TransformerBridges.
        n_tokens: the longest sequence the pair will run, tokens (for
            ``max_position_embeddings``).

    Raises:
        LocosError: other model classes, configuration dimensions, parameter names or
            shapes, or tokenizers (the message names the first difference); configs that
            differ outside :data:`HARMLESS_FIELDS` (the message names every such field
            with both values).
    """
    a, b = base.original_model, donor.original_model
    if type(a) is not type(b):
        raise LocosError(f"base is a {type(a).__name__}, donor a {type(b).__name__}: "
                         "cross-model patching needs one architecture")
    for f in ("n_layers", "d_model", "n_heads", "d_head", "n_key_value_heads", "d_mlp",
              "d_vocab"):
        x, y = getattr(base.cfg, f, None), getattr(donor.cfg, f, None)
        if x != y:
            raise LocosError(f"base and donor differ in cfg.{f}: {x} vs {y}")
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    if pa.keys() != pb.keys():
        raise LocosError(f"base and donor have other parameters: "
                         f"{sorted(pa.keys() ^ pb.keys())[:3]}")
    shape = next((n for n in pa if pa[n].shape != pb[n].shape), None)
    if shape is not None:
        raise LocosError(f"base and donor differ in the shape of {shape}: "
                         f"{tuple(pa[shape].shape)} vs {tuple(pb[shape].shape)}")
    if tokenizer_fingerprint(base.tokenizer) != tokenizer_fingerprint(donor.tokenizer):
        raise LocosError("base and donor have other tokenizers: the same ids would be "
                         "other tokens")
    diff = config_differences(a.config, b.config, n_tokens)
    if diff:
        raise LocosError("base and donor configs differ outside the MLPs, so patching every "
                         "MLP write cannot reproduce the donor: " + "; ".join(diff))
    other = [n for n in pa if ".mlp." not in n and pa[n] is not pb[n]
             and not torch.equal(pa[n].detach().cpu(), pb[n].detach().cpu())]
    if other:
        warn_caller(f"base and donor differ outside the MLPs ({len(other)} tensors, e.g. "
                    f"{other[:3]}): patching every MLP write will not reproduce the donor",
                    RuntimeWarning)


def _hook_name(layer: int) -> str:
    return f"blocks.{layer}.hook_mlp_out"


def capture_hooks(n_layers: int, store: dict[int, Tensor]) -> list[tuple[str, HookFn]]:
    """Hooks keeping every layer's MLP write ``[batch, pos, d_model]`` in ``store``."""
    def keep(l: int) -> HookFn:
        def fn(x: Tensor, hook: Any) -> None:
            store[l] = x.detach().clone()
        return fn
    return [(_hook_name(l), keep(l)) for l in range(n_layers)]


def patch_hooks(donor: dict[int, Tensor], layers: Sequence[int],
                positions: Sequence[int]) -> list[tuple[str, HookFn]]:
    """Hooks writing the donor's MLP writes (``donor[l]``, same batch and positions as the
    run) at ``positions`` of every row, at ``layers``."""
    idx = torch.tensor(sorted(set(int(p) for p in positions)), dtype=torch.long)

    def patch(l: int) -> HookFn:
        def fn(x: Tensor, hook: Any) -> Tensor:
            x = x.clone()
            i = idx.to(x.device)
            x[:, i] = donor[l][:, i].to(device=x.device, dtype=x.dtype)
            return x
        return fn
    return [(_hook_name(l), patch(l)) for l in layers]


@torch.no_grad()
def mlp_patch_logits(
    base: Any, donor: Any, tokens: Int[Tensor, "batch pos"], positions: Sequence[int],
    layers: Sequence[int] | None = None,
) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits of ``base`` on ``tokens`` with ``donor``'s MLP writes (on the same tokens)
    at ``positions`` (of every row) and ``layers`` (default: all); the building block of
    :func:`mlp_patching`, for checks at every position.

    Raises:
        LocosError: :func:`check_pair`.
        ValueError: a position outside ``tokens``.
    """
    check_pair(base, donor, int(tokens.shape[1]))
    L = int(base.cfg.n_layers)
    layers = list(range(L)) if layers is None else [int(l) for l in layers]
    bad = [p for p in positions if not 0 <= int(p) < tokens.shape[1]]
    if bad:
        raise ValueError(f"positions {bad[:3]} are outside the {tokens.shape[1]} tokens")
    store: dict[int, Tensor] = {}
    donor.run_with_hooks(tokens, return_type=None, fwd_hooks=capture_hooks(L, store))
    return base.run_with_hooks(tokens, return_type="logits",
                               fwd_hooks=patch_hooks(store, layers, positions))


def _positions(base: Any, trial: Trial, which: Any, width: int) -> tuple[str, list[int]]:
    """``(label, positions)`` of one position set in the teacher-forced sequence of
    ``trial.n_tokens + width - 1`` tokens."""
    n, total = trial.n_tokens, trial.n_tokens + width - 1
    if isinstance(which, str):
        if which not in POSITION_LABELS:
            raise ValueError(f"unknown positions {which!r}; use one of {POSITION_LABELS} or "
                             "a (start, end) span")
        needle = list(range(*trial.needle_span))
        question = (list(range(*question_span(base.tokenizer, trial)))
                    if which in ("question", "both") else [])
        return which, {"question": question, "needle": needle,
                       "both": sorted(set(question) | set(needle)), "prompt": list(range(n)),
                       "all": list(range(total)), "none": []}[which]
    s, e = as_span(which, total, "positions", name=f"trial {trial.trial_id}: positions")
    return f"[{s}, {e})", list(range(s, e))


def _margin(model: Any, trial: Trial, ids: list[list[int]],
            hooks: list[tuple[str, HookFn]]) -> dict[str, Any]:
    with model.hooks(fwd_hooks=hooks):  # hooks removed on exit and on exceptions
        return margin_of_logprobs(trial, name_logprobs(model, trial.tokens, ids))


def patch_trial(base: Any, donor: Any, trial: Trial, positions: Sequence[Any],
                layers: Layers) -> list[dict[str, Any]]:
    """:func:`mlp_patching`'s rows of one trial (its arguments)."""
    L = int(base.cfg.n_layers)
    ids = candidate_token_ids(base.tokenizer, trial)
    width = max(len(x) for x in ids)
    sets = [_positions(base, trial, p, width) for p in positions]  # fail before running
    store: dict[int, Tensor] = {}
    ref_d = _margin(donor, trial, ids, capture_hooks(L, store))
    ref_b = _margin(base, trial, ids, patch_hooks(store, range(L), []))  # bridge, as below
    gain = ref_d["name_margin"] - ref_b["name_margin"]
    rows = []
    for label, pos in sets:
        for layer in ["all", *(range(L) if layers == "each" else ())]:
            got = _margin(base, trial, ids, patch_hooks(
                store, range(L) if layer == "all" else [layer], pos))
            rows.append({
                "trial_id": trial.trial_id, "positions": label, "layer": layer,
                "n_positions": len(pos), "margin": got["name_margin"],
                "target_logprob": got["logp_target"], "base_margin": ref_b["name_margin"],
                "base_target_logprob": ref_b["logp_target"],
                "donor_margin": ref_d["name_margin"], "donor_target_logprob": ref_d["logp_target"],
                "recovered": (got["name_margin"] - ref_b["name_margin"]) / gain + 0.0
                if gain != 0 else float("nan")})
    return rows


def mlp_patching(
    base: Any,
    donor: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    *,
    positions: Sequence[Any] = ("question", "needle", "both"),
    layers: Layers = "all",
    progress: bool = True,
) -> pd.DataFrame:
    """Cross-model activation patching of MLP writes, donor -> base (module docstring).

    Args:
        base: a TransformerBridge.
        donor: a TransformerBridge of the same architecture, tokenizer and config up to
            :data:`HARMLESS_FIELDS` (the elicited model; ideally differing from ``base``
            in MLP weights only).
        trials: distractor trials (``meta["distractor_names"]``; "question" needs a
            question, :func:`~locos_tl.experiments.qrhead.question_span`).
        positions: position sets: labels of :data:`POSITION_LABELS` or ``(start, end)``
            spans of the teacher-forced sequence (module docstring).
        layers: ``"all"``: every layer at once; ``"each"``: that, and each layer alone.

    Returns:
        One row per trial, position set and layer (``"all"`` or an int): ``margin`` and
        ``target_logprob`` of the patched base (nats), ``n_positions``, the unpatched
        references ``base_margin``, ``base_target_logprob``, ``donor_margin``,
        ``donor_target_logprob``, and ``recovered`` (the fraction of the donor's margin
        gain, NaN when the two margins are equal). Columns :data:`COLUMNS`.

    Raises:
        LocosError: :func:`check_pair`.
        TrialError: a bare Trial; a trial without distractor names, without a findable
            question (for ``"question"`` / ``"both"``), or that does not fit the model.
        ValueError: unknown ``layers`` or position label.
    """
    if layers not in ("all", "each"):
        raise ValueError(f"unknown layers {layers!r}; use 'all' or 'each'")
    if isinstance(positions, str):
        raise ValueError(f"positions must be a list of position sets, e.g. [{positions!r}]")
    trials = as_trial_list(trials, "mlp_patching")
    check_trials_fit(base, trials, 1)
    check_pair(base, donor, max((t.n_tokens for t in trials), default=None))
    rows: list[dict[str, Any]] = []
    for t in tqdm(trials, desc="MLP patching", unit="trial", disable=not progress):
        rows += patch_trial(base, donor, t, list(positions), layers)
    return pd.DataFrame(rows, columns=COLUMNS)


def summarize_mlp_patching(df: pd.DataFrame, confidence: float | int = 0.95,
                           seed: int = 0) -> pd.DataFrame:
    """Means over trials of :func:`mlp_patching`'s rows, per position set and layer, with
    percentile bootstrap intervals over trials (:func:`~locos_tl.experiments.stats.bootstrap_ci`).

    Args:
        df: :func:`mlp_patching`'s table.
        confidence: confidence level of the intervals, in (0, 1), e.g. 0.95.
        seed: bootstrap resampling seed.

    Returns:
        ``positions``, ``layer``, ``n_trials``; ``margin``, ``gain`` (patched minus base
        margin, per trial) and ``target_logprob``, each with ``_low`` / ``_high``;
        ``base_margin``, ``donor_margin`` (means) and ``recovered`` (the mean gain over
        the mean donor gain); ``base_target_logprob``, ``donor_target_logprob`` (means)
        and ``recovered_target_logprob`` (the same fraction for the target's
        log-probability: meaningful where the donor also raises a distractor, so that
        the margin moves little). Order of first appearance.

    Raises:
        TrialError: ``df`` lacks a column of :data:`COLUMNS`.
        ValueError: ``confidence`` is not a level in (0, 1)
            (:func:`~locos_tl.experiments.stats.check_confidence`).
    """
    confidence = check_confidence(confidence)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TrialError(f"not an mlp_patching table: no column(s) {missing}")
    out = []
    for (pos, layer), g in df.groupby(["positions", "layer"], sort=False):
        row: dict[str, Any] = {"positions": pos, "layer": layer, "n_trials": len(g)}
        values = {"margin": g["margin"], "gain": g["margin"] - g["base_margin"],
                  "target_logprob": g["target_logprob"]}
        for k, v in values.items():
            v = np.asarray(v, dtype=float)
            row[k] = float(v.mean())
            row[f"{k}_low"], row[f"{k}_high"] = bootstrap_ci(v, confidence, seed)
        for metric, share in (("margin", "recovered"),
                              ("target_logprob", "recovered_target_logprob")):
            for what in ("base", "donor"):
                row[f"{what}_{metric}"] = float(g[f"{what}_{metric}"].mean())
            full = row[f"donor_{metric}"] - row[f"base_{metric}"]
            lift = row[metric] - row[f"base_{metric}"]  # the mean gain, as for "gain"
            row[share] = lift / full if full != 0 else float("nan")
        out.append(row)
    return pd.DataFrame(out)
