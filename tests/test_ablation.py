"""``ablate``: exact hook placement, clean removal, GQA, calibration means."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_close_within, model_tol, sum_tol

from locos_tl.engine.ablation import (
    ABLATION_MODES,
    AblationMeans,
    ablate,
    calibrate_means,
    random_heads,
)
from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.interventions import lens_hooks_attached

TOKENS = torch.tensor([[5 + (7 * i) % 300 for i in range(24)]])
HEADS = [(0, 1), (1, 2)]


@pytest.fixture(scope="module")
def model(qwen3):
    """The session's tiny Qwen3 (GQA: 4 query heads over 2 kv heads, QK-norm)."""
    return qwen3


@pytest.fixture(scope="module")
def means(model) -> AblationMeans:
    return calibrate_means(model, ["The quick brown fox jumps over the lazy dog.",
                                   [11, 12, 13, 14, 15, 16, 17]])


def _capture(model, names, tokens=TOKENS):
    """Logits and the activations at ``names`` (keyed by the names as asked)."""
    got = {}

    def keeper(name):
        def keep(x, hook):
            got[name] = x.detach().clone()
        return keep

    with torch.no_grad(), model.hooks(fwd_hooks=[(n, keeper(n)) for n in names]):
        logits = model(tokens)
    return logits, got


@pytest.mark.parametrize("mode", ABLATION_MODES)
def test_logits_bit_identical_after_block(model, means, mode) -> None:
    with torch.no_grad():
        before = model(TOKENS)
        with ablate(model, HEADS, mode, means=means):
            during = model(TOKENS)
        after = model(TOKENS)
    assert (during - before).abs().max() > 1e-3  # the ablation did something
    assert torch.equal(before, after)
    assert not lens_hooks_attached(model)


def test_hooks_removed_when_block_raises_and_foreign_hooks_kept(model, means) -> None:
    calls = []
    with torch.no_grad():
        before = model(TOKENS)
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: calls.append(1))]):
            with pytest.raises(KeyError, match="boom"):
                with ablate(model, HEADS, "query_mean", means=means):
                    model(TOKENS)
                    raise KeyError("boom")
            model(TOKENS)  # the caller's own hook is still attached
        after = model(TOKENS)
    assert len(calls) == 2
    assert torch.equal(before, after)
    assert not lens_hooks_attached(model)


def test_hook_q_is_before_qk_norm_and_rotary(model) -> None:
    _, got = _capture(model, ["blocks.1.ln1.hook_out", "blocks.1.attn.hook_q",
                              "blocks.1.attn.hook_rot_q"])
    W_q = model.original_model.model.layers[1].self_attn.q_proj.weight  # [H*d_head, d_model]
    x = got["blocks.1.ln1.hook_out"]
    expected = (x @ W_q.T).reshape(1, TOKENS.shape[1], 4, 16)
    # one sum of d_model terms; its partial sums are bounded by sum_i |x_i W_q[:, i]|
    with torch.no_grad():
        bound = (x.abs() @ W_q.abs().T).max()
    assert_close_within(got["blocks.1.attn.hook_q"], expected,
                        sum_tol(bound, int(model.cfg.d_model)), "hook_q = ln1 out @ W_Q")
    assert (got["blocks.1.attn.hook_rot_q"] - expected).abs().max() > 0.1


def test_query_zero_gives_uniform_attention_only_on_that_head(model) -> None:
    name = "blocks.1.attn.hook_pattern"
    _, clean = _capture(model, [name])
    with ablate(model, [(1, 2)], "query_zero"):
        _, abl = _capture(model, [name])
    P = TOKENS.shape[1]
    uniform = torch.tril(torch.ones(P, P)) / torch.arange(1, P + 1).unsqueeze(1)
    # softmax of equal scores: a sum of up to P ones, then one division
    assert_close_within(abl[name][0, 2], uniform, sum_tol(1.0, P, n_sums=2), "uniform rows")
    # GQA: head 3 reads the same kv head as head 2 and is untouched (layer 1's input is)
    assert_close_within(abl[name][0, [0, 1, 3]], clean[name][0, [0, 1, 3]],
                        model_tol(model, 1.0, n_tokens=P, layers=1, reads=2), "other rows")
    assert (clean[name][0, 2] - uniform).abs().max() > 0.05


def test_output_zero_removes_exactly_that_heads_write(model) -> None:
    names = ["blocks.0.attn.hook_z", "blocks.0.hook_attn_out"]
    _, clean = _capture(model, names)
    with ablate(model, [(0, 3)], "output_zero"):
        _, abl = _capture(model, names)
    W_O = model.blocks[0].attn.W_O.detach()  # [n_heads, d_head, d_model]
    write = clean["blocks.0.attn.hook_z"][0, :, 3] @ W_O[3]  # [pos, d_model]
    assert write.abs().max() > 1e-3
    # hook_attn_out sums n_heads * d_head terms z W_O, with and without head 3's: two
    # sums whose partial sums are bounded by sum |z| |W_O|
    z = clean["blocks.0.attn.hook_z"][0]
    bound = (z.abs().flatten(1) @ W_O.abs().flatten(0, 1)).max()
    assert_close_within(abl["blocks.0.hook_attn_out"][0],
                        clean["blocks.0.hook_attn_out"][0] - write,
                        sum_tol(bound, W_O.shape[0] * W_O.shape[1], n_sums=2),
                        "attn_out without head 3")


def test_mean_modes_substitute_the_calibration_mean(model, means) -> None:
    zeros = AblationMeans(q=torch.zeros_like(means.q), z=torch.zeros_like(means.z))
    with torch.no_grad():
        for kind in ("query", "output"):
            with ablate(model, HEADS, f"{kind}_zero"):
                a = model(TOKENS)
            with ablate(model, HEADS, f"{kind}_mean", means=zeros):
                b = model(TOKENS)
            with ablate(model, HEADS, f"{kind}_mean", means=means):
                c = model(TOKENS)
            assert torch.equal(a, b)
            assert (a - c).abs().max() > 1e-3


def test_calibrate_means_is_mean_of_per_prompt_means(model, means, tmp_path) -> None:
    prompts = [model.tokenizer.encode("The quick brown fox jumps over the lazy dog."),
               [11, 12, 13, 14, 15, 16, 17]]
    per_prompt = []
    for ids in prompts:
        _, got = _capture(model, ["blocks.1.attn.hook_q", "blocks.1.attn.hook_z"],
                          torch.tensor([ids]))
        per_prompt.append((got["blocks.1.attn.hook_q"][0].mean(0),
                           got["blocks.1.attn.hook_z"][0].mean(0)))
    # calibration runs on the twin, _capture on the bridge; then a mean over tokens
    n = max(len(p) for p in prompts)
    tol_q = model_tol(model, means.q[1], n_tokens=n, layers=1, reads=2)
    tol_z = model_tol(model, means.z[1], n_tokens=n, layers=1, reads=3)
    assert_close_within(means.q[1], (per_prompt[0][0] + per_prompt[1][0]) / 2, tol_q, "q")
    assert_close_within(means.z[1], (per_prompt[0][1] + per_prompt[1][1]) / 2, tol_z, "z")
    assert means.n_prompts == 2 and means.n_tokens == len(prompts[0]) + 7
    # chunked prefill gives the same means; max_tokens cuts prompts
    chunked = calibrate_means(model, prompts, chunk_size=3)
    assert_close_within(chunked.q, means.q, model_tol(model, means.q, n_tokens=n, reads=2),
                        "chunked q means")
    cut = calibrate_means(model, prompts, max_tokens=4)
    assert cut.n_tokens == 8
    loaded = AblationMeans.load(means.save(tmp_path / "means.safetensors"))
    assert torch.equal(loaded.q, means.q) and torch.equal(loaded.z, means.z)
    assert loaded.n_tokens == means.n_tokens and loaded.meta == means.meta


@pytest.mark.parametrize("prefill_mode", ["bridge", "auto"])
def test_ablation_acts_on_every_prompt_position_during_generation(model, prefill_mode) -> None:
    steps = []
    with torch.no_grad():
        clean = model(TOKENS)[0, -1]
        with ablate(model, [(0, 0), (0, 1), (0, 2), (0, 3)], "output_zero"):
            full = model(TOKENS)[0, -1]
            greedy_decode(model, TOKENS[0].tolist(), max_new_tokens=1,
                          prefill_mode=prefill_mode, on_step=steps.append)
    tol = model_tol(model, full, n_tokens=TOKENS.shape[1])
    assert (full - clean).abs().max() > 10 * tol
    assert_close_within(steps[0].logits, full, tol, "ablated step logits")


def test_bad_arguments_raise_before_hooking(model) -> None:
    # an unknown mode: ValueError, or TypeError from the test-time Literal check
    with pytest.raises((ValueError, TypeError), match="unknown ablation mode|mode"):
        with ablate(model, HEADS, "mean"):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match="outside"):
        with ablate(model, [(2, 0)], "query_zero"):
            pass
    with pytest.raises(ValueError, match="calibration means"):
        with ablate(model, HEADS, "query_mean"):
            pass
    assert not lens_hooks_attached(model)


def test_random_heads_seeded_distinct_nested() -> None:
    a = random_heads(6, 8, 10, seed=0)
    assert a == random_heads(6, 8, 10, seed=0)
    assert a != random_heads(6, 8, 10, seed=1)
    assert len(set(a)) == 10 and all(0 <= l < 6 and 0 <= h < 8 for l, h in a)
    assert random_heads(6, 8, 5, seed=0) == a[:5]
    ex = random_heads(6, 8, 40, seed=0, exclude=a[:8])
    assert not set(ex) & set(a[:8])
    with pytest.raises(ValueError):
        random_heads(2, 2, 5, seed=0)


def test_cli_calibrate(tiny_dirs, tmp_path) -> None:
    from typer.testing import CliRunner

    from locos_tl.cli import app

    (tmp_path / "calib.jsonl").write_text(
        '{"text": "The quick brown fox jumps over the lazy dog."}\n'
        '{"text": "In the evening the children walked to the market."}\n')
    res = CliRunner().invoke(app, ["calibrate", "--model", str(tiny_dirs["qwen3"]),
                                   "--prompts", str(tmp_path / "calib.jsonl"),
                                   "--out", str(tmp_path / "means.safetensors")])
    assert res.exit_code == 0, res.output
    means = AblationMeans.load(tmp_path / "means.safetensors")
    assert means.n_prompts == 2 and tuple(means.q.shape) == (2, 4, 16)
    assert means.q.abs().sum() > 0 and means.z.abs().sum() > 0
