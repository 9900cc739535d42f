"""The pure LOCOS kernel on hand-computed cases."""

import pytest
import torch

from locos_tl.engine.kernel import (
    head_value_directions,
    phi_from_pattern,
    spatial_contrast,
    value_logits,
)


def test_orthogonal_ov_gives_zero():
    d_model, d_head = 6, 3
    u = torch.zeros(d_model)
    u[0] = 1.0
    W_O = torch.zeros(2, d_head, d_model)
    W_O[:, :, 1:] = torch.randn(2, d_head, d_model - 1)  # writes only orthogonal to u
    v = torch.randn(5, 1, d_head)
    pattern = torch.softmax(torch.randn(2, 5), -1)
    assert torch.equal(phi_from_pattern(pattern, v, W_O, u), torch.zeros(2, 5))


def test_phi_matches_definition_by_hand():
    # one head, d_head=2, d_model=2: v_j W_O = v_j (identity), u = (1, 2)
    W_O = torch.eye(2).unsqueeze(0)
    u = torch.tensor([1.0, 2.0])
    v = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]])  # [pos=3, kv=1, d=2]
    pattern = torch.tensor([[0.5, 0.25, 0.25]])
    expected = torch.tensor([[0.5 * 1.0, 0.25 * 2.0, 0.25 * 3.0]])
    torch.testing.assert_close(phi_from_pattern(pattern, v, W_O, u), expected)


def test_gqa_grouping_reads_the_right_kv_head():
    n_heads, n_kv, d_head, pos = 4, 2, 3, 5
    v = torch.randn(pos, n_kv, d_head)
    w = torch.randn(n_heads, d_head)
    out = value_logits(v, w)
    for h in range(n_heads):
        g = h // (n_heads // n_kv)  # heads 0,1 -> kv 0; heads 2,3 -> kv 1
        torch.testing.assert_close(out[h], v[:, g, :] @ w[h])
    with pytest.raises(ValueError, match="multiple"):
        value_logits(torch.randn(pos, 3, d_head), w)


def test_head_value_directions():
    W_O = torch.randn(3, 4, 8)
    u = torch.randn(8)
    torch.testing.assert_close(head_value_directions(W_O, u), W_O @ u)


def test_uniform_phi_contrast_is_zero():
    phi = torch.full((3, 4, 10), 0.7)
    torch.testing.assert_close(spatial_contrast(phi, (2, 5)), torch.zeros(3, 4))


def test_rescaling_factor():
    phi = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    # span [1, 3): plus = 2 + 3 = 5; off-needle = 1 + 4 + 5 = 10, n/(N-n) = 2/3
    assert spatial_contrast(phi, (1, 3)).item() == pytest.approx(5 - 10 * 2 / 3)


def test_contrast_bad_spans():
    phi = torch.ones(4)
    for span in [(2, 2), (3, 5), (-1, 2)]:
        with pytest.raises(ValueError, match="not inside"):
            spatial_contrast(phi, span)
    with pytest.raises(ValueError, match="every key"):
        spatial_contrast(phi, (0, 4))
