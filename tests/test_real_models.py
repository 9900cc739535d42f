"""Exact on real pretrained weights: SmolLM2-135M-Instruct (CI) and
Gemma-3-270m (``slow``), dequantized from their GGUF files by ``locos models fetch``.

On prompts of 720-760 tokens of book text (both models; past Gemma's 512-token sliding
window) with a needle and a question:

- phi (raw and exact) equals an HF-only reference: attention probabilities, values and
  head outputs read with plain torch hooks from the Hugging Face model (eager
  attention) loaded from the same prepared directory, contracted in float64;
- exact ``sum_j phi`` equals the direct logit attribution from HF's head outputs
  (``o_proj`` input) with every norm scale frozen;
- greedy decoding equals HF ``generate`` token for token;
- batched scoring gives batch size 1's records;
- ablated decoding on the SDPA twin equals the bridge's hook path.

Tolerance: what float32 summation order alone changes on this model and prompt,
measured: ``noise`` is the largest difference between HF's eager and SDPA attention
(same weights, same float32, only the order of the sums differs) in the logits of the
last prompt position. Every quantity compared is in logits (phi, DLA, step logits,
LOCOS/DLA scores) or bounded by them (attention-mass and copy scores), and the two
sides differ only in summation order, so they must agree within ``TOL_FACTOR * noise``.
The factor covers a chain of a few such kernel changes (prefill, decode steps, the
ablation's module hooks) where ``noise`` measures one: measured on both models, with
OMP_NUM_THREADS=1 and the default, the largest error over noise ratio was 1.5 (ablated
decoding on SmolLM2: 3.8e-5 against a noise of 2.6e-5; Gemma: 1.7e-5 against 1.2e-5).
Each test also checks that the tolerance is small against the effect it guards (phi's
size, raw vs exact, ablated vs clean logits).

The tests skip when the model is not fetched, and fail instead when
``LOCOS_REQUIRE_REAL_MODELS=1`` (CI).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
import torch
from tolerances import assert_close_within

from locos_tl.data.packaged import book_dir

REQUIRE = os.environ.get("LOCOS_REQUIRE_REAL_MODELS") == "1"
HAYSTACK = book_dir()  # the books shipped with locos_tl
NEW = 6  # greedy tokens compared with HF generate
TOL_FACTOR = 8.0

# book-reading prompts: the instruct model gets its chat template, the base model a
# completion-style prompt (Gemma-3-270m answers no instruction-style question)
COMPLETION = ("Read the story, then answer the question with a name.\n\n{haystack}\n\n"
              "Question: {question}\nAnswer:")
SETUPS: dict[str, dict[str, Any]] = {
    "smollm2-135m-instruct": dict(chat_template=True, task_template=None,
                                  lengths=(720, 760, 740)),
    "gemma-3-270m": dict(chat_template=False, task_template=COMPLETION,
                         lengths=(720, 760, 740)),
}
MODELS = [pytest.param("smollm2-135m-instruct", id="smollm2"),
          pytest.param("gemma-3-270m", id="gemma3", marks=pytest.mark.slow)]


def require_fetched(name: str) -> None:
    """Skip (or, with ``LOCOS_REQUIRE_REAL_MODELS=1``, fail) when ``name`` is not
    prepared."""
    from locos_tl.models.zoo import get_real_model

    problems = []
    if not get_real_model(name).prepared:
        problems.append(f"{name} is not fetched (run `locos models fetch {name}`)")
    if problems:
        msg = "; ".join(problems)
        if REQUIRE:
            pytest.fail(f"{msg}, and LOCOS_REQUIRE_REAL_MODELS=1")
        pytest.skip(msg)


def needle_set(tmp: Path, template: str | None) -> Path:
    """A three-needle NoLiMa-format set with literal questions (a name as answer)."""
    entry = {
        "id": "9001", "reasoning_type": "literal",
        "system_prompt": "You are a helpful assistant.",
        "needle": "Actually, {CHAR} lives next to the {1}.",
        "questions": {"direct": "Which character lives next to the {1}?"},
        "character_set": ["Yuki", "Stuart", "Katie", "Diana"],
        "tests": {"T1": {"input_args": ["Semper Opera House"]},
                  "T2": {"input_args": ["Kiasma museum"]},
                  "T3": {"input_args": ["old lighthouse of Alexandria"]}},
    }
    if template is not None:
        entry["task_template"] = template
    path = tmp / "needles.json"
    path.write_text(json.dumps([entry]))
    return path


class Real:
    """A real model, its HF twin from the same directory, trials and shared results;
    each is computed on first use and kept for the session."""

    def __init__(self, name: str, tmp: Path) -> None:
        from transformers import AutoModelForCausalLM

        from locos_tl import load_model
        from locos_tl.models.zoo import get_real_model

        self.name, self.tmp, self.setup = name, tmp, SETUPS[name]
        self.bridge = load_model(name, device="cpu", dtype="float32")
        self.hf = AutoModelForCausalLM.from_pretrained(
            get_real_model(name).directory, dtype=torch.float32,
            attn_implementation="eager").eval()
        self._phi: dict[str, torch.Tensor] = {}

    @cached_property
    def trials(self) -> list[Any]:
        """Three trials of different lengths, needles and depths, tokenized as
        ``locos build-trials --tokenizer NAME`` does."""
        from locos_tl.data import (
            build_nolima_trials,
            expand_needle_set,
            load_haystacks,
            load_needle_set,
        )
        from locos_tl.data.hub import load_tokenizer

        items = expand_needle_set(load_needle_set(needle_set(self.tmp,
                                                             self.setup["task_template"])))
        hays = load_haystacks([HAYSTACK / "dracula_part1.txt"])
        out = []
        for item, n, depth in zip(items, self.setup["lengths"], (20, 55, 85), strict=True):
            out += build_nolima_trials(load_tokenizer(self.name), [item], hays, lengths=[n],
                                       depths=[depth], chat_template=self.setup["chat_template"])
        return out

    @property
    def main(self) -> Any:
        return self.trials[1]

    @cached_property
    def greedy(self) -> Any:
        """Greedy decoding of the main prompt; step 0's exact phi is kept (the answer
        token is the argmax, so it is ``phi_from_model(..., generated[0], "exact")``)."""
        from locos_tl.engine.decode import greedy_decode
        from locos_tl.engine.unembed import AnswerDirections

        steps: list[Any] = []
        res = greedy_decode(self.bridge, self.main.tokens, max_new_tokens=NEW,
                            stop_rule="none", stop_at_eos=False, on_step=steps.append,
                            directions=AnswerDirections(self.bridge, "exact"))
        self._phi["exact"] = steps[0].phi.detach()
        return res

    @cached_property
    def reference(self) -> dict[str, Any]:
        """HF eager forward of the main prompt: the last row of every attention pattern,
        values, head outputs and norm inputs (float32, as HF computes them)."""
        return hf_reference(self.hf, self.main.tokens)

    @cached_property
    def hf_sdpa(self) -> tuple[list[int], torch.Tensor]:
        """HF ``generate`` with SDPA attention: the greedy tokens and the logits of the
        last prompt position."""
        self.hf.set_attn_implementation("sdpa")
        try:
            with torch.no_grad():
                ids = torch.tensor([self.main.tokens])
                out = self.hf.generate(ids, attention_mask=torch.ones_like(ids),
                                       max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                                       pad_token_id=0, output_logits=True,
                                       return_dict_in_generate=True)
        finally:
            self.hf.set_attn_implementation("eager")
        return out.sequences[0, ids.shape[1]:].tolist(), out.logits[0][0].float()

    @cached_property
    def noise(self) -> float:
        """max |logits(eager) - logits(SDPA)| of HF at the last prompt position."""
        return float((self.reference["logits"] - self.hf_sdpa[1]).abs().max())

    @property
    def tol(self) -> float:
        return TOL_FACTOR * self.noise

    @property
    def answer_token(self) -> int:
        return self.greedy.generated[0]

    def phi(self, variant: str) -> torch.Tensor:
        """Bridge phi of the answer token at the last prompt position: ``phi_from_model`` for
        raw, the greedy decode's step 0 for exact (one prefill fewer)."""
        from locos_tl import phi_from_model

        y = self.answer_token  # decodes first: fills self._phi["exact"]
        if variant not in self._phi:
            self._phi[variant] = phi_from_model(self.bridge, self.main.tokens, y,
                                            variant=variant).detach()
        return self._phi[variant]


@pytest.fixture(scope="session", params=MODELS)
def real(request, tmp_path_factory) -> Real:
    require_fetched(request.param)
    return Real(request.param, tmp_path_factory.mktemp(request.param))


# ------------------------------------------------------------------ HF-only reference
def hf_reference(hf: Any, tokens: list[int]) -> dict[str, Any]:
    """Plain-HF forward (eager attention, output_attentions) with torch hooks on
    ``v_proj`` (values), ``o_proj``'s input (head outputs z), Gemma's post-attention
    norm input and the final norm input; rows of the last position only."""
    rec: dict[str, Any] = {"v": {}, "z": {}, "post": {}}
    hooks = []
    for l, layer in enumerate(hf.model.layers):
        attn = layer.self_attn
        hooks.append(attn.v_proj.register_forward_hook(
            lambda m, i, o, l=l: rec["v"].__setitem__(l, o[0].detach())))
        hooks.append(attn.o_proj.register_forward_pre_hook(
            lambda m, i, l=l: rec["z"].__setitem__(l, i[0][0, -1].detach())))
        if _post_norm(layer) is not None:
            hooks.append(_post_norm(layer).register_forward_pre_hook(
                lambda m, i, l=l: rec["post"].__setitem__(l, i[0][0, -1].detach())))
    hooks.append(hf.model.norm.register_forward_pre_hook(
        lambda m, i: rec.__setitem__("final", i[0][0, -1].detach())))
    try:
        with torch.no_grad():
            out = hf(torch.tensor([tokens]), output_attentions=True, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    rec["attn"] = [a[0, :, -1, :].detach() for a in out.attentions]  # [H, N] each
    rec["logits"] = out.logits[0, -1].detach()
    return rec


def _post_norm(layer: Any) -> Any:
    """The norm HF applies to the attention output (Gemma-3's post_attention_layernorm;
    Llama's post_attention_layernorm is the MLP's pre-norm, so Llama has none)."""
    return layer.post_attention_layernorm if hasattr(layer, "pre_feedforward_layernorm") else None


def _rms(norm: Any, x: torch.Tensor) -> torch.Tensor:
    eps = getattr(norm, "eps", None) or norm.variance_epsilon
    return (x.double().pow(2).mean() + eps).sqrt()


def _gain(hf: Any, norm: Any) -> torch.Tensor:
    offset = 1.0 if hf.config.model_type.startswith("gemma") else 0.0  # x * (1 + w)
    return norm.weight.double() + offset


def answer_directions(hf: Any, rec: dict[str, Any], y: int, variant: str) -> list[torch.Tensor]:
    """``u[l]`` in float64: ``W_U[:, y]``, times frozen final/post-norm gains over scales
    for ``exact``."""
    u = hf.lm_head.weight[y].double()
    if variant == "exact":
        u = u * _gain(hf, hf.model.norm) / _rms(hf.model.norm, rec["final"])
    out = []
    for l, layer in enumerate(hf.model.layers):
        post = _post_norm(layer)
        out.append(u * _gain(hf, post) / _rms(post, rec["post"][l])
                   if variant == "exact" and post is not None else u)
    return out


def _W_O(hf: Any, l: int) -> torch.Tensor:
    """``[H, d_head, d_model]`` from ``o_proj.weight [d_model, H * d_head]``, float64."""
    cfg = hf.config
    w = hf.model.layers[l].self_attn.o_proj.weight.double()
    return w.T.reshape(cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size)


def reference_phi(hf: Any, rec: dict[str, Any], y: int, variant: str) -> torch.Tensor:
    """``phi[l, h, j] = alpha[l, h, j] * (v[l, g(h), j] @ W_O[l, h]) . u[l]`` (Eq. 2),
    ``[n_layers, n_heads, N]`` float64, one head at a time."""
    cfg = hf.config
    H, n_kv, dh = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    us = answer_directions(hf, rec, y, variant)
    rows = []
    for l in range(cfg.num_hidden_layers):
        v = rec["v"][l].double().reshape(-1, n_kv, dh)
        W_O, alpha = _W_O(hf, l), rec["attn"][l].double()
        rows.append(torch.stack([alpha[h] * ((v[:, h // (H // n_kv)] @ W_O[h]) @ us[l])
                                 for h in range(H)]))
    return torch.stack(rows)


def reference_dla(hf: Any, rec: dict[str, Any], y: int) -> torch.Tensor:
    """Direct logit attribution ``z[l, h] @ W_O[l, h] . u_exact[l]``, ``[L, H]``."""
    cfg = hf.config
    us = answer_directions(hf, rec, y, "exact")
    return torch.stack([
        torch.einsum("hd,hdm->hm", rec["z"][l].double().reshape(cfg.num_attention_heads, -1),
                     _W_O(hf, l)) @ us[l]
        for l in range(cfg.num_hidden_layers)])


# ------------------------------------------------------------------ the tests
def test_noise_floor_is_float32_summation_order(real, record_property):
    """The tolerance's base: positive (the two kernels do differ) and at float32's
    relative precision times the logits' scale (not a bug)."""
    scale = float(real.reference["logits"].abs().max())
    record_property("noise", real.noise)
    assert 0 < real.noise < 1e-4 * scale


def test_phi_equals_hf_reference(real, record_property):
    ref = {v: reference_phi(real.hf, real.reference, real.answer_token, v)
           for v in ("raw", "exact")}
    for variant, r in ref.items():
        phi = real.phi(variant)
        assert phi.shape == r.shape == (real.bridge.cfg.n_layers, real.bridge.cfg.n_heads,
                                        real.main.n_tokens)
        diff = assert_close_within(phi.double(), r, real.tol, f"phi {variant}")
        record_property(f"phi_{variant}_max_abs_diff", diff)
        assert float(r.abs().max()) > 1e3 * real.tol  # the bound is tight against phi
    # raw and exact differ far beyond the tolerance: the comparison tells them apart
    assert float((ref["raw"] - ref["exact"]).abs().max()) > 100 * real.tol


def test_exact_phi_sums_to_direct_logit_attribution(real, record_property):
    dla = reference_dla(real.hf, real.reference, real.answer_token)
    total = real.phi("exact").double().sum(-1)
    diff = assert_close_within(total, dla, real.tol, "sum of exact phi vs DLA")
    record_property("dla_max_abs_diff", diff)
    assert float(dla.abs().max()) > 100 * real.tol


def test_greedy_decoding_equals_hf_generate(real):
    hf_tokens, _ = real.hf_sdpa
    assert real.greedy.generated == hf_tokens
    assert len(hf_tokens) == NEW


def test_batched_scoring_equals_batch_size_1(real, record_property):
    """Two trials of 720 and 760 tokens (left padding) decoded together give the records
    each gets alone: same tokens, response, gate, answer steps; every detector's scores
    and step values within the tolerance."""
    from locos_tl.detectors import DETECTORS, get_detector
    from locos_tl.engine.options import DecodeOptions
    from locos_tl.engine.unembed import AnswerDirections
    from locos_tl.runs.batch import batch_fallback_reason, run_trials_batched
    from locos_tl.runs.runner import run_trial

    # the gold answer is a word of the model's own greedy response on the main trial (a
    # name needs more than the 4 steps decoded here: "The character who lives next to ...
    # is Yuki"), so the gate passes and scores are compared, not only the tokens
    words = re.findall(r"[A-Za-z]{3,}", real.greedy.text)
    answer = words[1] if len(words) > 1 else words[0]
    model = real.bridge
    trials = [dataclasses.replace(t, answer=answer, trial_id="") for t in real.trials[:2]]
    assert batch_fallback_reason(model) is None
    assert trials[0].n_tokens != trials[1].n_tokens
    detectors = [get_detector(m) for m in DETECTORS]
    dirs = AnswerDirections(model, "exact")
    decode = DecodeOptions(max_new_tokens=4)
    ref = [run_trial(model, t, detectors, directions=dirs, decode=decode) for t in trials]
    got = run_trials_batched(model, trials, detectors, directions=dirs, batch_size=2,
                             decode=decode)
    worst = max(same_record(a, b, real.tol) for a, b in zip(ref, got, strict=True))
    record_property("batch_max_abs_diff", worst)
    record_property("responses", [r["response"] for r in ref])
    # not vacuous: LOCOS and most detectors have scores to compare (HeadKV's own gate
    # needs the answer copied from the needle, which a word of the response may not be)
    compared = sorted(m for m in DETECTORS if any(r["scores"].get(m) for r in ref))
    record_property("methods_compared", compared)
    assert "locos" in compared and len(compared) >= 4, [r["response"] for r in ref]


def same_record(a: dict, b: dict, tol: float) -> float:
    """Assert two trial records are equal (scores and step values within ``tol``);
    returns the largest score / step-value difference."""
    assert a.keys() == b.keys()
    worst = 0.0
    for k in a:
        if k not in ("scores", "step_values"):
            assert a[k] == b[k], (k, a[k], b[k])
            continue
        assert a[k].keys() == b[k].keys(), k
        for m, va in a[k].items():
            if va is None:
                assert b[k][m] is None, (k, m)
                continue
            worst = max(worst, assert_close_within(torch.tensor(b[k][m]), torch.tensor(va),
                                                   tol, f"{k}[{m}]"))
    return worst


def test_ablated_decoding_on_twin_equals_bridge(real, record_property):
    from locos_tl.engine.ablation import ablate, calibrate_means
    from locos_tl.engine.decode import greedy_decode

    model, tokens = real.bridge, real.main.tokens
    L, H = model.cfg.n_layers, model.cfg.n_heads
    heads = [(l, (3 * l) % H) for l in range(L)]  # one head per layer
    means = calibrate_means(model, [real.trials[2].tokens[:100], real.trials[2].tokens[-100:]])
    kw = dict(max_new_tokens=3, stop_rule="none", stop_at_eos=False)
    logits: dict[str, list[torch.Tensor]] = {"twin": [], "bridge": []}
    with ablate(model, heads, "query_mean", means=means):
        fast = greedy_decode(model, tokens, **kw)  # SDPA twin, module hooks
        twin = greedy_decode(model, tokens, on_step=lambda s: logits["twin"].append(s.logits),
                             **kw)  # SDPA twin prefill, eager twin steps
        ref = greedy_decode(model, tokens, prefill_mode="bridge", decode_engine="bridge",
                            on_step=lambda s: logits["bridge"].append(s.logits), **kw)
    assert fast.generated == twin.generated == ref.generated
    a, b = torch.stack(logits["twin"]), torch.stack(logits["bridge"])
    diff = assert_close_within(a, b, real.tol, "ablated step logits, twin vs bridge")
    record_property("ablated_logits_max_abs_diff", diff)
    effect = float((a[0] - real.reference["logits"]).abs().max())  # vs the clean step 0
    record_property("ablation_effect", effect)
    assert effect > 100 * real.tol


def test_ablated_decoding_on_a_layer_prefix_equals_the_full_prompt(real, record_property):
    """Layer-prefix reuse (locos_tl.engine.prefix) at real scale: a 720-760 token prompt
    (Gemma-3-270m: longer than its 512-token windows), head sets starting in the middle
    and near the top; the same kernels on the same inputs, so bit-equal."""
    from locos_tl.engine.ablation import ablate, calibrate_means
    from locos_tl.engine.decode import greedy_decode
    from locos_tl.engine.prefix import prompt_prefix

    model, tokens = real.bridge, real.main.tokens
    L, H = model.cfg.n_layers, model.cfg.n_heads
    sets = [[(L // 2, 0), (L - 1, 1)], [(L - 3, h) for h in range(H)]]
    means = calibrate_means(model, [real.trials[2].tokens[:100], real.trials[2].tokens[-100:]])
    prefix = prompt_prefix(model, tokens, sets)
    assert sorted(prefix.resid) == sorted({L // 2, L - 3})
    kw = dict(max_new_tokens=3, stop_rule="none", stop_at_eos=False,
              score_continuations=[tokens[-3:], tokens[5:7]])
    for heads in sets:
        runs = []
        for pre in (None, prefix):
            steps: list[torch.Tensor] = []
            with ablate(model, heads, "query_mean", means=means):
                res = greedy_decode(model, tokens,
                                    on_step=lambda s, out=steps: out.append(s.logits),
                                    prefix=pre, **kw)
            runs.append((res.generated, torch.stack(steps), res.continuation_logprobs))
        assert runs[0][0] == runs[1][0]
        assert torch.equal(runs[0][1], runs[1][1])
        assert runs[0][2] == runs[1][2]
    record_property("prefix_resid_bytes", prefix.nbytes)
