"""Float tolerances from what a comparison can guarantee, instead of magic numbers.

Two computations of one quantity that differ only in the order of their additions
(another kernel, another thread count, a cached against an uncached forward, a batch
against one row, the bridge against its HF twin) differ by rounding alone. A sum of
``k`` terms, added in any order in a float format of unit roundoff ``u = eps / 2``, is
within

    ``|s_computed - s| <= u * (|s_2| + ... + |s_k|) <= (k - 1) * u * M``

of the exact sum, ``s_i`` being the partial sums and ``M`` a bound on their magnitude
(first order in ``u``; Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.
2002, Sec. 4.2, eq. 4.4). Two orders of one sum therefore differ by at most
``(k - 1) * eps * M``: :func:`sum_tol`.

A model output is a chain of such sums. The residual stream adds one attention and one
MLP write per layer, each the output of reductions no longer than the model's longest
(``d_model``, ``d_mlp``, ``n_heads * d_head`` or the attended positions), and the
logits read it through ``W_U`` (one more). :func:`model_tol` adds one
:func:`sum_tol` per link of that chain with ``k`` the longest reduction and ``M`` the
magnitude of the compared values (the scale the rounding acts on: logits, head outputs,
scores). It is a first-order bound that counts no amplification between layers and lets
the compared values stand for their partial sums: an estimate from the magnitudes, not a
proof. Over the ~1900 comparisons that use it (both thread settings) the largest error
seen was 0.07 of its tolerance (``tests/test_batch.py``), 0.02 for logits
(``tests/test_compress_decode.py``). Set ``LOCOS_TOLERANCE_LOG=FILE`` to append every
comparison's observed error and tolerance to ``FILE``.
"""

from __future__ import annotations

import os
from typing import Any

import torch

#: float32 machine epsilon, 2**-23
EPS32 = float(torch.finfo(torch.float32).eps)
#: float64 machine epsilon, 2**-52
EPS64 = float(torch.finfo(torch.float64).eps)


def sum_tol(scale: float, k: int, n_sums: int = 1, eps: float = EPS32) -> float:
    """Largest difference between two summation orders of ``n_sums`` chained sums of
    ``k`` terms whose partial sums stay below ``scale`` in magnitude:
    ``n_sums * (k - 1) * eps * scale`` (``k = 1``: one rounding, ``eps * scale``)."""
    return n_sums * max(k - 1, 1) * eps * float(scale)


def longest_reduction(model: Any, n_tokens: int = 0) -> int:
    """The longest sum in a forward pass of ``model`` (a TransformerBridge): ``d_model``,
    ``d_mlp``, ``n_heads * d_head`` (``W_O``) or the ``n_tokens`` attended positions."""
    cfg = model.cfg
    dims = [int(cfg.d_model), int(cfg.n_heads) * int(cfg.d_head), int(n_tokens)]
    if getattr(cfg, "d_mlp", None):
        dims.append(int(cfg.d_mlp))
    return max(dims)


def model_tol(model: Any, values: Any, *, n_tokens: int = 0, layers: int | None = None,
              reads: int = 1, eps: float = EPS32) -> float:
    """Tolerance for a model output computed two ways that differ in summation order.

    Args:
        model: the TransformerBridge.
        values: the reference values compared (their largest magnitude is the scale).
        n_tokens: attended positions (the prompt length).
        layers: layers the residual stream went through before the values are read
            (default: all); each adds an attention and an MLP write.
        reads: sums that read the values off the residual stream: 1 for the logits
            (``W_U``) or a layer's cached keys / values (``W_K`` / ``W_V``); 2 for a
            head output ``z`` (``W_V``, then the pattern-weighted sum over positions).
        eps: machine epsilon of the compute dtype.
    """
    n_layers = int(model.cfg.n_layers) if layers is None else int(layers)
    values = torch.as_tensor(values).detach()
    scale = float(values.abs().nan_to_num().max()) if values.numel() else 0.0
    return sum_tol(scale, longest_reduction(model, n_tokens), 2 * n_layers + reads, eps)


def assert_close_within(actual: Any, expected: Any, tol: float, what: str = "",
                        equal_nan: bool = False) -> float:
    """``torch.testing.assert_close`` with absolute tolerance ``tol`` (no relative part:
    ``tol`` already scales with the magnitudes); returns the observed largest error."""
    actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
    torch.testing.assert_close(actual, expected, atol=tol, rtol=0, equal_nan=equal_nan,
                               check_dtype=False,
                               msg=lambda m: f"{what}: {m} (tolerance {tol:.3g})")
    err = (float((actual.double() - expected.double()).abs().nan_to_num().max())
           if actual.numel() else 0.0)
    log = os.environ.get("LOCOS_TOLERANCE_LOG")
    if log:  # margins for the record: observed error / tolerance per comparison
        with open(log, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]}\t{what}\t"
                    f"{err:.3e}\t{tol:.3e}\t{err / tol if tol else 0:.4f}\n")
    return err
