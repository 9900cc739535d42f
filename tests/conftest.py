"""Shared fixtures: tiny random-init checkpoints of real architectures.

Each checkpoint is built once per session with ``save_pretrained`` and loaded through
``locos_tl.load_model`` (the same path a real model takes). Tests must not mutate the
loaded models; hooks are always removed by the code under test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    from locos_tl.models.tiny import ARCHS, byte_bpe_tokenizer, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny")
    tok = byte_bpe_tokenizer()
    return {a: make_tiny_checkpoint(a, root / a, seed=1, tokenizer=tok) for a in ARCHS}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    from locos_tl import load_model

    cache: dict[str, object] = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = load_model(tiny_dirs[arch], device="cpu")
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def windowed(tmp_path_factory):
    """``get(arch, dtype="float32")``: the bridge of a tiny checkpoint (seed 3) whose
    sliding windows are shorter than the tests' prompts
    (:data:`locos_tl.models.tiny.SHORT_WINDOWS`), built once per session, loaded once per
    ``(arch, dtype)``."""
    from locos_tl import load_model
    from locos_tl.models.tiny import SHORT_WINDOWS, byte_bpe_tokenizer, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("windowed")
    tok = byte_bpe_tokenizer()
    cache: dict[tuple[str, str], object] = {}

    def get(arch: str, dtype: str = "float32"):
        if (arch, dtype) not in cache:
            d = root / arch
            if not d.exists():
                make_tiny_checkpoint(arch, d, seed=3, tokenizer=tok, **SHORT_WINDOWS[arch])
            cache[arch, dtype] = load_model(d, device="cpu", dtype=dtype)
        return cache[arch, dtype]

    return get


@pytest.fixture(scope="session")
def deep_windowed(tmp_path_factory):
    """``get(arch)``: the float32 bridge of a 4-layer tiny checkpoint (seed 4) with the
    short sliding windows of :data:`locos_tl.models.tiny.SHORT_WINDOWS`, built and
    loaded once per session (layer-prefix reuse needs layers above and below the
    ablated one)."""
    from locos_tl import load_model
    from locos_tl.models.tiny import SHORT_WINDOWS, byte_bpe_tokenizer, make_tiny_checkpoint

    root = tmp_path_factory.mktemp("deep")
    tok = byte_bpe_tokenizer()
    cache: dict[str, object] = {}

    def get(arch: str):
        if arch not in cache:
            d = make_tiny_checkpoint(arch, root / arch, seed=4, tokenizer=tok,
                                     num_hidden_layers=4, **SHORT_WINDOWS[arch])
            cache[arch] = load_model(d, device="cpu")
        return cache[arch]

    return get


@pytest.fixture(scope="session")
def qwen3(tiny_models):
    return tiny_models("qwen3")


@pytest.fixture(scope="session")
def own_answer_trials(qwen3):
    """Three trials on the tiny Qwen3 whose gold answer is a word of the model's own
    greedy response (so they pass the ROUGE gate on a random-init model); needle span
    [5, 9)."""
    import re

    import torch

    from locos_tl import Trial
    from locos_tl.engine.decode import greedy_decode

    out = []
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(1, int(qwen3.cfg.d_vocab) - 1, (30,), generator=g).tolist()
        words = re.findall(r"[A-Za-z]{3,}", greedy_decode(qwen3, tokens, max_new_tokens=8).text)
        if words:
            out.append(Trial(tokens=tokens, needle_span=(5, 9), answer=words[0],
                             meta={"seed": seed}))
        if len(out) == 3:
            return out
    raise RuntimeError("no prompt with a word in its response")


@pytest.fixture(scope="session")
def organism():
    """The shipped 2-layer organism ``retrieval-2l`` (``SMALL_ORGANISM``: 2 x 8 heads, 2
    kv groups, prompts up to 128 tokens) on the CPU, loaded once."""
    from locos_tl import load_model
    from locos_tl.organisms import SMALL_ORGANISM

    if not (Path(SMALL_ORGANISM) / "config.json").exists():
        pytest.fail(f"the shipped organism is missing: {SMALL_ORGANISM}")
    return load_model(SMALL_ORGANISM, device="cpu")


# ------------------------------------------------------------- GGUF files and the cache
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny random Llama written as a Q8_0 GGUF file (``tests/gguf_tiny.py``)."""
    pytest.importorskip("gguf", reason="the gguf extra is not installed")
    from gguf_tiny import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture
def tiny_zoo(tiny_gguf, monkeypatch):
    """The tiny GGUF file registered as the zoo model ``tiny-test`` (not yet prepared;
    nothing is pip-installed)."""
    import hashlib

    from locos_tl.models import zoo

    sha = hashlib.sha256(tiny_gguf.read_bytes()).hexdigest()
    e = zoo.RealModel(name="tiny-test", architecture="LlamaForCausalLM", n_layers=2,
                      n_heads=4, n_kv_heads=2, params="0.1M", file_mb=0, quantization="Q8_0",
                      licence="MIT", packages=("no-such-package-locos==0.1",), sha256=sha)
    monkeypatch.setitem(zoo.REAL_MODELS, "tiny-test", e)
    monkeypatch.setitem(zoo._FILES, "tiny-test", lambda: tiny_gguf)
    monkeypatch.setattr(zoo, "pip_install", lambda *a, **k: None)
    return e


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache root for the test (``LOCOS_CACHE``)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("LOCOS_CACHE", str(root))
    return root


@pytest.fixture
def forward_count(monkeypatch):
    """``forward_count.n``: the forward passes run since the fixture was made. Every
    forward embeds its tokens, whatever runs it (the bridge, the SDPA or eager twin, one
    decode step): ``torch.nn.Embedding.forward`` is wrapped to count its calls."""
    from types import SimpleNamespace

    import torch

    counter = SimpleNamespace(n=0)
    real = torch.nn.Embedding.forward

    def counting(self, *args, **kwargs):
        counter.n += 1
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Embedding, "forward", counting)
    return counter


@pytest.fixture(params=["no_grad", "set_grad_enabled", "inference_mode"])
def grad_off(request):
    """How a caller turns autograd off (TransformerLens's demos start with
    ``torch.set_grad_enabled(False)``): ``grad_off.name`` and ``grad_off.context()``, a
    fresh ``torch.no_grad()``, ``torch.set_grad_enabled(False)`` or
    ``torch.inference_mode()``."""
    from types import SimpleNamespace

    import torch

    make = {"no_grad": torch.no_grad, "set_grad_enabled": lambda: torch.set_grad_enabled(False),
            "inference_mode": torch.inference_mode}[request.param]
    return SimpleNamespace(name=request.param, context=make)
