"""Attention-only baselines on hand-built attention rows (method.md Sec. 3)."""

from __future__ import annotations

import pytest
import torch

from locos_tl.detectors import HeadKV, WuCopy
from locos_tl.detectors.attention import headkv_step, wu_copy_step

# 6 key positions; the span is [2, 4) (2 tokens); y_t = 7.
KEYS = torch.tensor([3, 5, 7, 9, 4, 7])
SPAN = (2, 4)


def _rows(*rows: list[float]) -> torch.Tensor:
    t = torch.tensor(rows, dtype=torch.float32)
    assert torch.allclose(t.sum(-1), torch.ones(len(rows)))
    return t.unsqueeze(0)  # [1 layer, heads, pos]


def test_wu_hit_at_argmax_in_span_with_matching_token() -> None:
    pattern = _rows(
        [0.05, 0.05, 0.6, 0.1, 0.1, 0.1],  # argmax 2, in span, token 7 == y: hit
        [0.05, 0.05, 0.1, 0.6, 0.1, 0.1],  # argmax 3, in span, token 9 != y: no hit
        [0.05, 0.05, 0.1, 0.1, 0.1, 0.6],  # argmax 5, token 7 == y but outside span
        [0.3, 0.05, 0.25, 0.2, 0.1, 0.1],  # most mass in span, argmax outside: no hit
    )
    got = wu_copy_step(pattern, KEYS, 7, SPAN)
    assert got.tolist() == [[0.5, 0.0, 0.0, 0.0]]  # 1/|span| = 1/2 for the hit


def test_wu_token_mismatch_gives_zero() -> None:
    pattern = _rows([0.05, 0.05, 0.6, 0.1, 0.1, 0.1])
    assert wu_copy_step(pattern, KEYS, 8, SPAN).item() == 0.0  # y_t = 8 is not at pos 2
    assert wu_copy_step(pattern, KEYS, 7, SPAN).item() == 0.5


def test_wu_span_normalisation() -> None:
    pattern = _rows([0.05, 0.05, 0.6, 0.1, 0.1, 0.1])
    assert wu_copy_step(pattern, KEYS, 7, (2, 3)).item() == 1.0
    assert wu_copy_step(pattern, KEYS, 7, (1, 5)).item() == 0.25
    assert wu_copy_step(pattern, KEYS, 7, (0, 6)).item() == pytest.approx(1 / 6)


def test_headkv_mass_of_top_span_positions() -> None:
    pattern = _rows(
        [0.1, 0.05, 0.4, 0.3, 0.1, 0.05],  # top-2 = {2, 3}, both in span: (0.4+0.3)/2
        [0.1, 0.05, 0.5, 0.02, 0.03, 0.3],  # top-2 = {2, 5}: only 0.5 counts -> 0.25
        [0.4, 0.3, 0.1, 0.1, 0.05, 0.05],  # top-2 = {0, 1}: nothing in span
    )
    got = headkv_step(pattern, SPAN)
    torch.testing.assert_close(got, torch.tensor([[0.35, 0.25, 0.0]]))


def test_headkv_ignores_tokens_and_normalises_by_span() -> None:
    pattern = _rows([0.1, 0.05, 0.4, 0.3, 0.1, 0.05])
    # span of 1 token: top-1 = pos 2 -> 0.4 / 1
    assert headkv_step(pattern, (2, 3)).item() == pytest.approx(0.4)
    # span of 4 tokens [1, 5): top-4 = {2, 3, 0, 4} (0.1 ties resolved by topk); the
    # in-span ones are 2, 3 and possibly 4: (0.4 + 0.3 + 0.1) / 4 or (0.4 + 0.3) / 4
    v = headkv_step(pattern, (1, 5)).item()
    assert v in (pytest.approx(0.8 / 4), pytest.approx(0.7 / 4))


def test_all_step_detectors_sum_over_steps() -> None:
    values = torch.tensor([[[0.5, 0.0]], [[0.5, 0.25]], [[0.0, 0.25]]])  # [steps, 1, 2]
    for det in (WuCopy(), HeadKV()):
        torch.testing.assert_close(det.trial_score(values), torch.tensor([[1.0, 0.5]]))
