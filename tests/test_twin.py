"""The SDPA twin is the bridge's model by construction, and prefills it exactly.

The twin shares every tensor with the bridge, and its KV cache and
next-token logits equal the bridge's own prefill to float32 summation order
(``tests/tolerances.py``) on Qwen3 (with a
sliding layer), Gemma-3 (window shorter than the prompt), OLMo-2 and Llama. Low
precision never disables it; a fallback warns with its reason.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl.engine.twin import build_twin, twin_info
from locos_tl.models.tiny import SHORT_WINDOWS


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_twin_prefill_equals_bridge_prefill(windowed, arch):
    from transformers import DynamicCache

    model = windowed(arch)
    info = twin_info(model)
    assert info.path == "sdpa_twin", info.reason
    cfg = model.original_model.config
    ids = torch.randint(1, int(model.cfg.d_vocab), (1, 40),
                        generator=torch.Generator().manual_seed(0))
    c_twin, c_bridge = DynamicCache(config=cfg), DynamicCache(config=cfg)
    with torch.no_grad():
        a = info.twin(ids, past_key_values=c_twin, use_cache=True).logits[0, -1]
        b = model(ids, return_type="logits", past_key_values=c_bridge, use_cache=True)[0, -1]
    n = ids.shape[1]
    assert_close_within(a, b, model_tol(model, b, n_tokens=n), "twin vs bridge logits")
    sliding = 0
    for l, (lt, lb) in enumerate(zip(c_twin.layers, c_bridge.layers, strict=True)):
        assert lt.keys.shape == lb.keys.shape
        sliding += lt.keys.shape[-2] < ids.shape[1]
        assert_close_within(lt.keys, lb.keys, model_tol(model, lb.keys, n_tokens=n, layers=l),
                            f"keys L{l}")
        assert_close_within(lt.values, lb.values,
                            model_tol(model, lb.values, n_tokens=n, layers=l), f"values L{l}")
    if arch in ("qwen3", "gemma3"):  # the window really is shorter than the prompt
        assert sliding >= 1


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_twin_shares_every_tensor(windowed, arch):
    model = windowed(arch)
    twin = twin_info(model).twin
    own = {p.data_ptr() for p in model.original_model.parameters()}
    assert all(p.data_ptr() in own for p in twin.parameters())
    assert sum(p.numel() for p in twin.parameters()) > 0
    assert twin.config._attn_implementation == "sdpa"


def test_bf16_keeps_the_twin(windowed):
    """bf16 rounding must never switch the fast path off (it did via a logit probe)."""
    model = windowed("qwen3", "bfloat16")
    assert twin_info(model).path == "sdpa_twin"


class _DeviceMapped:
    class _HF:
        hf_device_map = {"model.layers.0": 0, "model.layers.1": 1}

    original_model = _HF()


def test_fallback_warns_with_the_reason():
    fake = _DeviceMapped()
    with pytest.warns(RuntimeWarning, match="split over devices"):
        info = twin_info(fake)
    assert info.path == "bridge" and "device_map" in info.reason
    weakref.ref(fake)  # cached per model, weakly


def test_softcapping_is_refused(windowed):
    import copy

    model = windowed("gemma3")
    fake = type("M", (), {})()
    fake.original_model = copy.copy(model.original_model)
    fake.original_model.config = copy.deepcopy(model.original_model.config)
    fake.original_model.config.attn_logit_softcapping = 50.0
    with pytest.raises(RuntimeError, match="soft-capping"):
        build_twin(fake)
