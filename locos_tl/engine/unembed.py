"""Answer directions in the residual stream: raw unembedding or norm-frozen ("exact").

``raw`` (paper default, the "direct path"): ``u_y = W_U[:, y]``; the final norm's gain
and per-token ``1/rms``, and post-attention norms, are ignored.

``exact`` (this project's addition, docs/concepts.md): every norm scale is frozen at its
forward-pass value, so a head's write ``r`` reaches logit ``y`` as
``r . u_eff`` with ``u_eff = (g_post / s_post) * (g_final / s_final) * W_U[:, y]``
(``g`` = ``offset + gamma``; offset 1 for Gemma-style RMSNorm), centred first when the
final norm is a LayerNorm. Then ``sum_j phi[l, h, t, j]`` equals head ``(l, h)``'s
direct logit attribution for ``y_t``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

Variant = Literal["raw", "exact"]
VARIANTS: tuple[str, ...] = ("raw", "exact")


def check_variant(variant: str) -> Variant:
    """Return ``variant`` or raise ``ValueError`` naming the allowed values."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; use one of {VARIANTS}")
    return variant  # type: ignore[return-value]


def _norm_gain(norm_module: Any, offset: bool) -> Tensor | None:
    comp = getattr(norm_module, "original_component", norm_module)
    w = getattr(comp, "weight", None)
    if w is None:
        return None
    w = w.detach().to(torch.float32)
    return w + 1.0 if offset else w


def _is_layernorm(model: Any) -> bool:
    return str(getattr(model.cfg, "normalization_type", "RMS")).upper().startswith("LN")


class AnswerDirections:
    """Per-layer residual directions of an answer token under a variant.

    Args:
        model: a TransformerBridge.
        variant: ``"raw"`` or ``"exact"``.

    Raises:
        ValueError: unknown variant.
    """

    def __init__(self, model: Any, variant: str = "raw") -> None:
        self.variant = check_variant(variant)
        self.n_layers = int(model.cfg.n_layers)
        self.W_U = model.W_U.detach()  # [d_model, d_vocab]
        offset = bool(getattr(model.cfg, "rmsnorm_uses_offset", False))
        self.layernorm = _is_layernorm(model)
        ln_final = getattr(model, "ln_final", None)
        self.final_gain = _norm_gain(ln_final, offset) if ln_final is not None else None
        self.post_gains: list[Tensor | None] = [
            _norm_gain(b.ln1_post, offset) if hasattr(b, "ln1_post") else None
            for b in model.blocks
        ]
        self.has_post_norm = any(g is not None for g in self.post_gains)

    def hook_names(self) -> list[str]:
        """Norm-scale hooks the ``exact`` variant needs at the query position."""
        if self.variant == "raw":
            return []
        names = ["ln_final.hook_scale"] if self.final_gain is not None else []
        names += [
            f"blocks.{l}.ln1_post.hook_scale"
            for l, g in enumerate(self.post_gains)
            if g is not None
        ]
        return names

    def __call__(
        self, token: int, scales: dict[str, float | Tensor] | None = None
    ) -> Float[Tensor, "n_layers d_model"]:
        """Directions ``u_eff[l]`` for answer token ``token``.

        Args:
            token: the answer token id ``y_t``.
            scales: cached ``hook_scale`` values at the query position, keyed by hook
                name (needed for ``exact``); floats or 0-d tensors (kept on the device).

        Raises:
            KeyError: ``exact`` without a needed scale.
        """
        u = self.W_U[:, token].to(torch.float32)
        if self.variant == "raw":
            return u.expand(self.n_layers, -1)
        scales = scales or {}
        if self.final_gain is not None:
            u = u * self.final_gain.to(u.device) / scales["ln_final.hook_scale"]
            if self.layernorm:
                u = u - u.mean()
        rows = []
        for l, g in enumerate(self.post_gains):
            if g is None:
                rows.append(u)
            else:
                rows.append(u * g.to(u.device) / scales[f"blocks.{l}.ln1_post.hook_scale"])
        return torch.stack(rows)
