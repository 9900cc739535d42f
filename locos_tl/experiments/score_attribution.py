"""Attention-score attribution: which upstream components make a head's query meet the
needle's keys.

For head ``(l, h)`` (kv head ``g(h)``), query position ``i`` (the answer position) and
key position ``j``, the bridge computes the pre-softmax score
(``blocks.{l}.attn.hook_attn_scores``)

    S_ij = tau <q_i, k_j>,   q_i = R_i N_q(W_Q N_1(x_i) + b_Q),   k_j = R_j N_k(W_K N_1(x_j) + b_K)

with ``x`` the residual stream entering layer ``l``, ``N_1`` the layer's input RMSNorm
(none on OLMo-2), ``N_q`` / ``N_k`` the QK-norms (Qwen3, Gemma-3: RMSNorm of each head
after the projection; OLMo-2: one RMSNorm over all heads; Llama: none), ``R_p`` the
rotary rotation of position ``p`` and ``tau`` the attention module's ``scaling``
(``d_head^-1/2``; Gemma-3: ``query_pre_attn_scalar^-1/2``). The residual stream is the
sum of what wrote into it, ``x_p = sum_c c_p``: the embedding (``blocks.0.hook_resid_pre``),
every earlier layer's attention write (``hook_attn_out``, after a post-attention norm
where there is one; per head with ``split_heads``) and MLP write (``hook_mlp_out``).

An RMSNorm ``g * x / s(x)`` is not linear in ``x``; with its scale ``s`` frozen at its
value in this forward it is. Freezing ``s_1(p)``, ``s_q(p)`` and ``s_k(p)`` (the QK-norm
scales are per head and position, or per position on OLMo-2) gives

    q_c = R_i (g_q * W_Q (g_1 * c_i / s_1(i)) / s_q(i)),   k_c likewise at j,

and, with the exact ``k_j`` and ``q_i`` of the forward,

    query side  A^Q_c = tau <q_c, k_j>,      key side  A^K_c = tau <q_i, k_c>,
    sum_c A^Q_c + A^Q_bias = S_ij = sum_c A^K_c + A^K_bias

(``bias``: the projection's bias through the frozen QK-norm and ``R``; no row without
one). The identity is exact up to float rounding; :func:`score_attribution` reports its
residual. Units: attention logits (the softmax's input); a component with ``A^Q_c > 0``
raises key ``j``'s score for query ``i`` in head ``(l, h)``, the other components fixed
and the norm scales frozen (the attention also depends on the other keys' scores). This
is the QK circuit of Elhage et al. 2021 ("A Mathematical Framework for Transformer
Circuits", Transformer Circuits Thread) read on one forward, with TransformerLens's
frozen-scale convention (``ActivationCache.decompose_resid``,
``apply_ln_to_stack``).

Refused with ``NotImplementedError`` naming the architecture: LayerNorm, attention logit
soft-capping (Gemma-2: ``tanh`` is not linear), partial or interleaved rotary, a QK-norm
after the rotation, ``clip_qkv``, gated or split-input queries, a key multiplier, Llama-4
query scaling, and any attention bridge other than ``PositionEmbeddingsAttentionBridge``.
Keys outside a sliding window are masked (no score) and refused with ``ValueError``.

Cost per trial: one bridge forward of the prompt up to ``i`` (keeping only the slices at
``i`` and the keys), then ``O(C (d_model + n_keys) H d_head)`` per layer for ``C``
components.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import pandas as pd
import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor

from locos_tl.engine.interventions import is_shared_q_norm
from locos_tl.errors import TrialError
from locos_tl.head_spec import as_int, parse_heads
from locos_tl.heads import head_label
from locos_tl.runs.runner import check_trials_fit
from locos_tl.trials import Trial, as_span, as_trial_list

Keys = Literal["each", "sum"]
COLUMNS = ["trial_id", "layer", "head", "label", "query_pos", "key_pos", "side", "component",
           "contribution", "exact_score", "linearised_sum", "residual"]
#: config flags of the attention bridge that make the score path non-linear or unmodelled
_REFUSED_FLAGS = ("rotary_interleaved_cos_sin", "rotary_adjacent_pairs", "qk_norm_after_rope",
                  "gated_q_proj", "use_split_qkv_input", "use_attn_in")


def _arch(model: Any) -> str:
    return type(model.original_model).__name__


def _hf(module: Any) -> Any:
    inner = getattr(module, "original_component", None)
    return module if inner is None else inner


def _gain(norm: Any) -> Tensor:
    """The elementwise gain of an RMSNorm bridge (``1 + w`` for Gemma's offset form)."""
    w = _hf(norm).weight.detach().double()
    return w + 1.0 if getattr(norm, "uses_weight_offset", False) else w


def check_linearisable(model: Any, layers: Sequence[int]) -> None:
    """Refuse a model whose attention scores at ``layers`` are not linear in the residual
    stream once the norm scales are frozen (module docstring).

    Raises:
        NotImplementedError: the reason, naming the architecture.
    """
    arch, cfg = _arch(model), model.cfg

    def refuse(why: str) -> None:
        raise NotImplementedError(f"score attribution is not implemented for {arch}: {why}")

    if getattr(cfg, "positional_embedding_type", None) != "rotary":
        refuse(f"positional embedding {getattr(cfg, 'positional_embedding_type', None)!r} "
               "(only rotary is modelled)")
    flags = [f for f in _REFUSED_FLAGS if getattr(cfg, f, False)]
    if flags:
        refuse(f"config flags {flags}")
    for l in layers:
        block, attn = model.blocks[l], model.blocks[l].attn
        hf = _hf(attn)
        if type(attn).__name__ != "PositionEmbeddingsAttentionBridge":
            refuse(f"layer {l}'s attention is a {type(attn).__name__}")
        if getattr(hf, "attn_logit_softcapping", None) is not None:
            refuse(f"attention logit soft-capping ({hf.attn_logit_softcapping}) puts a tanh "
                   "on the score")
        if getattr(getattr(hf, "config", None), "clip_qkv", None) is not None:
            refuse("clip_qkv clamps the queries and keys")
        if getattr(hf, "key_multiplier", None) is not None:
            refuse("a learned key multiplier")
        rope = getattr(getattr(hf, "config", None), "rope_parameters", None)
        if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") is not None:
            refuse("Llama-4 query scaling by position")
        norms = [getattr(attn, n) for n in ("q_norm", "k_norm") if hasattr(attn, n)]
        if hasattr(block, "ln1"):
            norms.append(block.ln1)
        bad = [type(n).__name__ for n in norms if type(n).__name__ != "RMSNormalizationBridge"]
        if bad:
            refuse(f"norm {bad[0]} at layer {l} (only RMSNorm is linearised)")


def _slices(model: Any, tokens: list[int], positions: list[int], layers: list[int],
            split_heads: bool) -> dict[str, Tensor]:
    """One bridge forward of ``tokens``; every hook value needed, at ``positions`` only
    (float64): ``[n_positions, ...]``, the QK-norm scales ``[n_positions, H or 1]``,
    the last query's score row ``[n_heads, n_keys]``."""
    out: dict[str, Tensor] = {}
    per_pos = ["blocks.0.hook_resid_pre"]
    for m in range(max(layers)):
        per_pos += [f"blocks.{m}.hook_mlp_out", f"blocks.{m}.attn.hook_z" if split_heads
                    else f"blocks.{m}.hook_attn_out"]
        if split_heads and hasattr(model.blocks[m], "ln1_post"):
            per_pos.append(f"blocks.{m}.ln1_post.hook_scale")
    for l in layers:
        a = f"blocks.{l}.attn"
        per_pos += [f"{a}.hook_rot_q", f"{a}.hook_rot_k", f"{a}.hook_cos", f"{a}.hook_sin"]
        if hasattr(model.blocks[l], "ln1"):
            per_pos.append(f"blocks.{l}.ln1.hook_scale")
    idx = torch.tensor(positions)

    # hook.name is the canonical name behind an alias: key each value by the name asked
    def keep(name: str) -> Any:  # [b, pos, ...] ([pos, d] for a shared rotary)
        def fn(x: Tensor, hook: Any) -> None:
            x = x.detach().double()
            out[name] = (x[None] if x.dim() == 2 else x)[0, idx.to(x.device)].cpu()
        return fn

    def keep_norm(name: str, attn: Any) -> Any:  # [b, pos, 1] or per head [b, H, pos, 1]
        def fn(x: Tensor, hook: Any) -> None:
            x = x.detach().double()
            if getattr(attn, "_qk_norm_phase", None) == "post_reshape" and \
                    not getattr(attn, "_qk_norm_per_head", False):
                x = x.transpose(1, 2)  # [b, pos, H, 1]
            out[name] = x[0, idx.to(x.device)].reshape(len(positions), -1).cpu()
        return fn

    def keep_row(name: str) -> Any:  # [b, H, q, k]: the last query's row
        def fn(x: Tensor, hook: Any) -> None:
            out[name] = x[0, :, -1].detach().double().cpu()
        return fn

    hooks = [(n, keep(n)) for n in per_pos]
    for l in layers:
        attn = model.blocks[l].attn
        hooks += [(n, keep_norm(n, attn)) for n in
                  (f"blocks.{l}.attn.{w}_norm.hook_scale" for w in "qk")
                  if hasattr(attn, n.split(".")[-2])]
        hooks.append((f"blocks.{l}.attn.hook_attn_scores",
                      keep_row(f"blocks.{l}.attn.hook_attn_scores")))
    device = next(model.original_model.parameters()).device
    with torch.no_grad():
        model.run_with_hooks(torch.tensor([tokens], device=device), return_type=None,
                             fwd_hooks=hooks)
    return out


def _components(model: Any, c: dict[str, Tensor], layer: int, split_heads: bool,
                ) -> tuple[list[str], Float[Tensor, "comp pos d_model"]]:
    """The writes into the residual stream entering ``layer``, at the kept positions."""
    names, rows = ["embed"], [c["blocks.0.hook_resid_pre"]]
    for m in range(layer):
        if split_heads:
            o = _hf(_hf(model.blocks[m].attn).o_proj)
            H, d = int(model.cfg.n_heads), int(model.cfg.d_head)
            W = o.weight.detach().double().reshape(-1, H, d)  # [d_model, H, d_head]
            z = c[f"blocks.{m}.attn.hook_z"]  # [pos, H, d_head]
            heads = einsum(z, W, "pos h d, m h d -> h pos m")
            bias = (o.bias.detach().double().expand_as(heads[0])[None]
                    if getattr(o, "bias", None) is not None else heads[:0])
            writes = torch.cat([heads, bias])
            if hasattr(model.blocks[m], "ln1_post"):  # frozen post-attention norm
                writes = writes * _gain(model.blocks[m].ln1_post) / \
                    c[f"blocks.{m}.ln1_post.hook_scale"]
            names += [f"L{m}H{h}" for h in range(H)] + [f"L{m}.attn_bias"] * len(bias)
            rows += list(writes)
        else:
            names.append(f"L{m}.attn")
            rows.append(c[f"blocks.{m}.hook_attn_out"])
        names.append(f"L{m}.mlp")
        rows.append(c[f"blocks.{m}.hook_mlp_out"])
    return names, torch.stack(rows)


def _project(model: Any, c: dict[str, Tensor], layer: int, comps: Tensor, which: str,
             rows: slice) -> tuple[Float[Tensor, "comp pos n d_head"], bool]:
    """``which`` (``"q"`` or ``"k"``) of each component at the kept positions ``rows``,
    with every norm scale frozen, rotated; a last component for the projection's bias
    when it has one (then True)."""
    attn, d = model.blocks[layer].attn, int(model.cfg.d_head)
    a = f"blocks.{layer}.attn"
    if hasattr(model.blocks[layer], "ln1"):
        comps = comps * _gain(model.blocks[layer].ln1) / \
            c[f"blocks.{layer}.ln1.hook_scale"][rows]
    proj = _hf(getattr(_hf(attn), f"{which}_proj"))
    y = einsum(comps, proj.weight.detach().double(), "c pos m, o m -> c pos o")
    has_bias = getattr(proj, "bias", None) is not None
    if has_bias:
        y = torch.cat([y, proj.bias.detach().double().expand_as(y[0])[None]])
    y = y.reshape(*y.shape[:2], -1, d)  # [comp, pos, n, d_head]
    norm = getattr(attn, f"{which}_norm", None)
    if norm is not None:
        scale = c[f"{a}.{which}_norm.hook_scale"][rows, :, None]  # [pos, n or 1, 1]
        g = _gain(norm)
        shared = is_shared_q_norm(_hf(norm), y.shape[2], d)
        y = y * (g.reshape(-1, d) if shared else g) / scale
    cos, sin = c[f"{a}.hook_cos"][rows], c[f"{a}.hook_sin"][rows]  # [pos, rotary_dim]
    if cos.shape[-1] != d:
        raise NotImplementedError(f"score attribution is not implemented for "
                                  f"{_arch(model)}: partial rotary ({cos.shape[-1]} of {d})")
    half = torch.cat([-y[..., d // 2 :], y[..., : d // 2]], dim=-1)  # HF's rotate_half
    return y * cos[:, None] + half * sin[:, None], has_bias


def _trial_rows(model: Any, trial: Trial, heads: list[tuple[int, int]], span: tuple[int, int],
                query_pos: int, keys: Keys, split_heads: bool) -> list[dict[str, Any]]:
    s, e = span
    positions = [*range(s, e), query_pos]
    layers = sorted({l for l, _ in heads})
    c = _slices(model, list(trial.tokens[: query_pos + 1]), positions, layers, split_heads)
    H, n_kv, K = int(model.cfg.n_heads), int(model.cfg.n_key_value_heads), e - s
    rows: list[dict[str, Any]] = []
    for l in layers:
        a = f"blocks.{l}.attn"
        tau = float(getattr(_hf(model.blocks[l].attn), "scaling", model.cfg.d_head ** -0.5))
        names, comps = _components(model, c, l, split_heads)
        q_c, qb = _project(model, c, l, comps[:, -1:], "q", rows=slice(K, K + 1))
        k_c, kb = _project(model, c, l, comps[:, :K], "k", rows=slice(0, K))  # [c, K, H_kv, d]
        for l2, h in heads:
            if l2 != l:
                continue
            g = h // (H // n_kv)
            q, k = c[f"{a}.hook_rot_q"][-1, h], c[f"{a}.hook_rot_k"][:K, g]
            exact = c[f"{a}.hook_attn_scores"][h, s:e]
            if bool((exact < torch.finfo(torch.float32).min / 2).any()):
                raise ValueError(f"trial {trial.trial_id}: keys of [{s}, {e}) are masked for "
                                 f"query {query_pos} at layer {l} (sliding window): no score")
            sides = {"query": (tau * q_c[:, 0, h] @ k.T, qb),  # [comp, K]
                     "key": (tau * einsum(k_c[:, :, g], q, "c k d, d -> c k"), kb)}
            for side, (contrib, bias) in sides.items():
                labels = names + (["bias"] if bias else [])
                cols = ([(p, contrib[:, p - s], exact[p - s]) for p in range(s, e)]
                        if keys == "each" else [(None, contrib.sum(1), exact.sum())])
                for key_pos, vals, ex in cols:
                    total = float(vals.sum())
                    rows += [{"trial_id": trial.trial_id, "layer": l, "head": h,
                              "label": head_label(l, h), "query_pos": query_pos,
                              "key_pos": key_pos, "side": side, "component": name,
                              "contribution": float(v), "exact_score": float(ex),
                              "linearised_sum": total, "residual": float(ex) - total}
                             for name, v in zip(labels, vals, strict=True)]
    return rows


def score_attribution(
    model: Any,
    trials: Any,  # Sequence[Trial]; one bare Trial is refused (as_trial_list)
    heads: Any,
    *,
    span: str | tuple[int, int] = "needle",
    query_pos: int | None = None,
    keys: Keys = "each",
    split_heads: bool = False,
) -> pd.DataFrame:
    """Decompose heads' attention scores from the answer position to the needle's keys
    into the upstream components' contributions, on the query side and on the key side
    (module docstring).

    Args:
        model: a TransformerBridge with rotary attention and RMSNorms.
        trials: trials (a list).
        heads: heads to attribute, e.g. ``[(5, 2), "L7H1"]``.
        span: the key positions: ``"needle"`` / ``"answer"`` (``Trial.span``) or an
            explicit ``(start, end)``, end exclusive, with ``end <= query_pos + 1``.
        query_pos: the query position ``i``; default the last prompt position (where the
            answer's first token is predicted).
        keys: ``"each"``: one row per key position; ``"sum"``: contributions and scores
            summed over the span (``key_pos`` is None).
        split_heads: each earlier attention layer's write as one component per head
            (``"L3H2"``, and ``"L3.attn_bias"`` where ``o_proj`` has a bias) instead of
            ``"L3.attn"``; a post-attention norm's scale is frozen too.

    Returns:
        One row per trial, head, key (or span), side (``"query"``, ``"key"``) and
        component (``"embed"``, ``"L{m}.attn"`` or ``"L{m}H{h}"``, ``"L{m}.mlp"``,
        ``"bias"``): ``contribution`` (attention logits), ``exact_score`` (the model's
        ``hook_attn_scores``), ``linearised_sum`` (the side's contributions summed) and
        ``residual`` (``exact_score - linearised_sum``: float rounding alone). Columns
        :data:`COLUMNS`.

    Raises:
        TrialError: a bare Trial; a trial that does not fit the model; a span not before
            ``query_pos``.
        HeadSpecError: malformed heads.
        ValueError: unknown ``keys``; keys masked by a sliding window.
        NotImplementedError: an architecture whose scores cannot be linearised
            (:func:`check_linearisable`).
    """
    if keys not in ("each", "sum"):
        raise ValueError(f"unknown keys {keys!r}; use 'each' or 'sum'")
    trials = as_trial_list(trials, "score_attribution")
    hs = parse_heads(heads, model)
    check_linearisable(model, sorted({l for l, _ in hs}))
    check_trials_fit(model, trials, 1)
    rows: list[dict[str, Any]] = []
    for t in trials:
        i = t.n_tokens - 1 if query_pos is None else as_int(query_pos, "query_pos", TrialError)
        if not 0 <= i < t.n_tokens:
            raise TrialError(f"trial {t.trial_id}: query_pos {i} is outside its "
                             f"{t.n_tokens} tokens")
        sp = t.span(span) if isinstance(span, str) else as_span(
            span, t.n_tokens, "span", name=f"trial {t.trial_id}: span")
        if sp[1] > i + 1:
            raise TrialError(f"trial {t.trial_id}: the span [{sp[0]}, {sp[1]}) is not before "
                             f"the query position {i}: no score")
        rows += _trial_rows(model, t, hs, sp, i, keys, split_heads)
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["key_pos"] = df["key_pos"].astype("Int64")
    return df
