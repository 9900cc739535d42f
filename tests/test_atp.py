"""Attribution patching (locos_tl.experiments.atp) against independent computations.

Oracles, none sharing AtP's code path (one batched backward on the SDPA twin over a KV
cache): (a) per head, the derivative at ``eps = 0`` of
``eps -> m(z_corr + eps (z_clean - z_corr))``, by autograd on the scalar ``eps`` and by
central differences, each through plain full-sequence bridge forwards; (b) CRI itself,
where the metric is affine in the head's ``z``; (c) CRI's ranking on the trained
organism.

The tiny models run in float64, but Hugging Face norms cast their input to float32, so
the forward is float32-accurate: tolerances use float32's epsilon (tests/tolerances.py).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
from scipy.stats import spearmanr
from tolerances import assert_close_within, model_tol

import locos_tl as lt
from locos_tl import Trial
from locos_tl.errors import LocosError
from locos_tl.experiments.atp import atp_heads, atp_trial
from locos_tl.experiments.patching import corrupt_tokens, cri_trial

ORG = Path(__file__).resolve().parents[1] / "data" / "organisms" / "retrieval-2l"


@pytest.fixture(scope="module")
def f64(tiny_dirs):
    cache: dict[str, object] = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = lt.load_model(tiny_dirs[arch], device="cpu", dtype=torch.float64)
        return cache[arch]

    return get


def _trial(model, seed: int = 0) -> Trial:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (30,), generator=g).tolist()
    return Trial(tokens=tokens, needle_span=(5, 9), answer="the")


def _tol(model, tokens) -> float:
    """CRI's tolerance (tests/test_patching.py): a difference of two logit differences,
    four logits' float32 summation-order bound at the scale of the logits."""
    with torch.no_grad():
        logits = model(torch.tensor([list(tokens)]), return_type="logits")[0]
    return 4 * model_tol(model, logits, n_tokens=len(tokens))


def _patched_metric(model, corr, z_clean, l, h, gold, cf, eps):
    """m of the corrupted run with head (l, h)'s z moved by eps toward the clean z (a
    full-sequence bridge forward, no cache)."""
    def move(x, hook):
        x = x.clone()
        x[:, :, h] = x[:, :, h] + eps * (z_clean[:, :, h] - x[:, :, h])
        return x

    out = model.run_with_hooks(corr, fwd_hooks=[(f"blocks.{l}.attn.hook_z", move)])[0, -1]
    return out[gold] - out[cf]


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_atp_is_the_first_order_term_of_patching(f64, arch) -> None:
    """(a) AtP(l, h) = d/d eps m(z_corr + eps (z_clean - z_corr)) at eps = 0."""
    model = f64(arch)
    t = _trial(model)
    rec = atp_trial(model, t, answer_position="prompt_end")
    assert rec["accepted"] and rec["shared_prefix"] == 5 and rec["n_backwards"] == 1
    atp = torch.tensor(rec["scores"]["atp"], dtype=torch.float64)
    gold, cf = rec["gold"], rec["counterfactual"]
    clean = torch.tensor([t.tokens])
    corr = torch.tensor([corrupt_tokens(model.tokenizer, t, "filler")])
    with torch.no_grad():
        _, cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_z"))
    L, H = int(model.cfg.n_layers), int(model.cfg.n_heads)
    exact = torch.zeros(L, H, dtype=torch.float64)
    central = torch.zeros(L, H, dtype=torch.float64)
    step = 1e-2
    for l in range(L):
        z = cache[f"blocks.{l}.attn.hook_z"]
        for h in range(H):
            eps = torch.zeros((), dtype=torch.float64, requires_grad=True)
            with torch.enable_grad():
                m = _patched_metric(model, corr, z, l, h, gold, cf, eps)
                exact[l, h] = torch.autograd.grad(m, eps)[0]
            with torch.no_grad():
                central[l, h] = (_patched_metric(model, corr, z, l, h, gold, cf, step)
                                 - _patched_metric(model, corr, z, l, h, gold, cf, -step)
                                 ) / (2 * step)
    assert atp.abs().max() > 0.1  # a real signal, not zeros agreeing
    # same derivative, other code path (twin + cache + one backward vs bridge per head):
    # float32 rounding only (measured <= 3.3e-7 at |AtP| ~ 1 on qwen3)
    assert_close_within(atp, exact, _tol(model, t.tokens), f"{arch}: AtP vs d/d eps")
    # central differences, step 1e-2: truncation ~ step^2 |m'''| / 6 plus the float32
    # rounding of m divided by the step (~1e-6 / 1e-2); measured 4.1e-5 on qwen3 (|AtP|
    # <= 1.16) and 7.8e-5 on gemma3 (|AtP| <= 0.74); 2e-3 of the scale leaves >= 25x
    tol_fd = 2e-3 * max(1.0, float(atp.abs().max()))
    assert float((central - atp).abs().max()) <= tol_fd, (central, atp)


def test_atp_on_generated_answer_matches_the_autograd_oracle(qwen3, own_answer_trials):
    """The ``generated`` position (prefix tokens before the answer) in float32."""
    t = own_answer_trials[0]
    rec = atp_trial(qwen3, t, max_new_tokens=8)
    assert rec["accepted"]
    atp = torch.tensor(rec["scores"]["atp"], dtype=torch.float64)
    from locos_tl.experiments.clean_corrupted import answer_target

    prefix, _ = answer_target(qwen3, t, "generated", 8)
    assert rec["prefix_len"] == len(prefix)
    clean = torch.tensor([list(t.tokens) + prefix])
    corr = torch.tensor([corrupt_tokens(qwen3.tokenizer, t, "filler") + prefix])
    with torch.no_grad():
        _, cache = qwen3.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_z"))
    exact = torch.zeros_like(atp)
    for l in range(int(qwen3.cfg.n_layers)):
        for h in range(int(qwen3.cfg.n_heads)):
            eps = torch.zeros((), requires_grad=True)
            with torch.enable_grad():
                m = _patched_metric(qwen3, corr, cache[f"blocks.{l}.attn.hook_z"], l, h,
                                    rec["gold"], rec["counterfactual"], eps)
                exact[l, h] = float(torch.autograd.grad(m, eps)[0])
    assert_close_within(atp, exact, _tol(qwen3, clean[0].tolist()), "AtP, generated")


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_atp_equals_cri_where_the_metric_is_linear(f64, arch) -> None:
    """(b) With the final norm's scale frozen and the last layer's MLP output zeroed, m is
    affine in every last-layer head's z (only W_O, the residual sum, a fixed norm scale
    and W_U follow), so the first-order term is the whole patching effect: AtP = CRI
    there. Layer 0 still passes through layer 1, and the two differ: the check has
    power."""
    model = f64(arch)
    t = _trial(model)
    L = int(model.cfg.n_layers)
    frozen = [("ln_final.hook_scale", lambda x, hook: torch.full_like(x, 2.0)),
              (f"blocks.{L - 1}.hook_mlp_out", lambda x, hook: torch.zeros_like(x))]
    with warnings.catch_warnings():  # the bridge says the norm is rebuilt from its hooks
        warnings.simplefilter("ignore", UserWarning)
        with model.hooks(fwd_hooks=frozen):
            atp = torch.tensor(atp_trial(model, t, answer_position="prompt_end")
                               ["scores"]["atp"], dtype=torch.float64)
            cri = torch.tensor(cri_trial(model, t, answer_position="prompt_end",
                                         reuse_prefix=False)["scores"]["cri"],
                               dtype=torch.float64)
            tol = _tol(model, t.tokens)
    assert cri[L - 1].abs().max() > 10 * tol  # heads that move the metric
    assert_close_within(atp[L - 1], cri[L - 1], tol, f"{arch}: last layer, AtP vs CRI")
    assert (atp[0] - cri[0]).abs().max() > 10 * tol  # nonlinear below: they differ


def test_atp_ranks_the_organism_heads_like_cri() -> None:
    """(c) The trained organism (2 layers x 8 heads): AtP and CRI over all 16 heads.

    Measured (12 trials per task, seed 3, 128 tokens, ``prompt_end``; ``generated``
    gives the same numbers, the answer being the first response token):
    Spearman rho 0.976 (non-literal), 0.924 (literal); top-5 overlap 0.8 and 1.0.
    Layer 1 agrees closely (rho 1.00 and 0.95 within the layer): its heads reach the
    logits through one norm. AtP misses the layer-0 previous-token heads, whose effect
    goes through layer 1's attention keys, a saturated softmax that the linearisation
    flattens (non-literal (0, 0): CRI 5.9, AtP 0.02 logits; literal (0, 2): CRI 17.0,
    AtP 1.4): attention saturation, as AtP* (arXiv 2403.00745) calls it. Bounds: rho >
    0.85 and overlap >= 0.6 (3 of 5) leave a margin below what was measured."""
    model = lt.load_model(ORG, device="cpu")
    truth = json.loads((ORG / "ground_truth.json").read_text())
    from locos_tl.organisms.tasks import make_trials

    for task, writers in (("nonliteral", truth["nonliteral_writer"]),
                          ("literal", truth["literal_copy"])):
        trials = make_trials(task, 12, 128, seed=3)
        kw = dict(answer_position="prompt_end", progress=False)
        atp = atp_heads(model, trials, **kw)
        cri = lt.patch_heads(model, trials, **kw)
        assert atp.n_trials == cri.n_trials == 12 and atp.meta["units"] == "logits"
        rho = spearmanr(atp.scores.flatten(), cri.scores.flatten()).statistic
        overlap = len(set(atp.top_k(5)) & set(cri.top_k(5))) / 5
        assert rho > 0.85, (task, rho)
        assert overlap >= 0.6, (task, overlap)
        # the ground-truth heads lead AtP's ranking
        assert set(atp.top_k(len(writers))) == {tuple(h) for h in writers}, task
        prev = (0, 0) if task == "nonliteral" else (0, 2)  # the documented miss
        assert cri.scores[prev] > 10 * abs(float(atp.scores[prev])), task


def test_atp_resumes_and_refuses_other_settings(qwen3, own_answer_trials, tmp_path,
                                                monkeypatch) -> None:
    kw = dict(max_new_tokens=8, progress=False)
    fresh = atp_heads(qwen3, own_answer_trials, **kw)
    run = tmp_path / "atp"
    atp_heads(qwen3, own_answer_trials[:2], out_dir=run, **kw)
    with pytest.raises(LocosError, match="another trial set"):
        atp_heads(qwen3, own_answer_trials, out_dir=run, **kw)
    run2 = tmp_path / "atp2"
    first = atp_heads(qwen3, own_answer_trials, out_dir=run2, **kw)
    done: list[str] = []
    mod = sys.modules["locos_tl.experiments.atp"]
    real = mod.atp_trial
    monkeypatch.setattr(mod, "atp_trial", lambda m, t, **k: done.append(t.trial_id)
                        or real(m, t, **k))
    again = atp_heads(qwen3, own_answer_trials, out_dir=run2, **kw)
    assert done == []  # every trial reused
    torch.testing.assert_close(again.trial_scores, first.trial_scores, rtol=0, atol=0)
    torch.testing.assert_close(fresh.trial_scores, first.trial_scores, rtol=0, atol=0)
    with pytest.raises(LocosError, match="other settings"):
        atp_heads(qwen3, own_answer_trials, out_dir=run2, filler="Lorem ipsum. ", **kw)
    saved = lt.HeadScores.load(first.save(tmp_path / "saved"))
    assert saved.method == "atp"
    torch.testing.assert_close(saved.scores, first.scores)


def test_atp_bad_options(qwen3, own_answer_trials) -> None:
    # a ValueError naming the choices; under the tests' runtime type checker
    # (--jaxtyping-packages) the Literal annotation refuses first, with a TypeError
    with pytest.raises((ValueError, TypeError), match="metric"):
        atp_heads(qwen3, own_answer_trials, metric="kl")  # type: ignore[arg-type]
    with pytest.raises((ValueError, TypeError), match="corruption"):
        atp_heads(qwen3, own_answer_trials, corruption="noise")  # type: ignore[arg-type]
    with pytest.raises(lt.TrialError, match="list"):
        atp_heads(qwen3, own_answer_trials[0])


def test_score_trials_and_methods_dispatch_atp(qwen3, own_answer_trials, tmp_path) -> None:
    kw = dict(max_new_tokens=8, progress=False)
    direct = atp_heads(qwen3, own_answer_trials, **kw)
    one = lt.score_trials(qwen3, own_answer_trials, method="atp", **kw)
    assert one.method == "atp"
    torch.testing.assert_close(one.trial_scores, direct.trial_scores, rtol=0, atol=0)
    run = tmp_path / "run"
    both = lt.score_methods(qwen3, own_answer_trials, methods=["locos", "atp"], out_dir=run,
                            **kw)
    assert list(both) == ["locos", "atp"]
    torch.testing.assert_close(both["atp"].trial_scores, direct.trial_scores, rtol=0, atol=0)
    alone = lt.score_trials(qwen3, own_answer_trials, method="locos", **kw)
    torch.testing.assert_close(both["locos"].scores, alone.scores)
    for f in ("trials.jsonl", "meta.json", "atp/trials.jsonl", "atp/meta.json",
              "atp/head_scores.json"):
        assert (run / f).exists(), f
    loaded = lt.load_head_scores(run, "atp")
    torch.testing.assert_close(loaded.scores, direct.scores)
    assert lt.load_head_scores(run, "locos").method == "locos"
    with pytest.raises(ValueError, match="atp reads no span"):
        lt.score_trials(qwen3, own_answer_trials, method="atp", spans={"atp": "needle"}, **kw)


def test_atp_under_no_grad_and_inference_mode(qwen3, own_answer_trials, grad_off) -> None:
    """Autograd off as TransformerLens's demos start (``torch.set_grad_enabled(False)``),
    ``torch.no_grad()`` or ``torch.inference_mode()``: AtP turns autograd on for its own
    backward only, so the scores are the plain call's bit for bit (the same code on the
    same inputs) and the caller's grad mode is as it was."""
    kw = dict(max_new_tokens=8, progress=False)
    plain = atp_heads(qwen3, own_answer_trials, **kw)
    assert plain.meta["n_accepted"] == 3
    with grad_off.context():
        got = atp_heads(qwen3, own_answer_trials, **kw)
        one = lt.score_trials(qwen3, own_answer_trials, method="atp", **kw)
        assert not torch.is_grad_enabled()
        assert torch.is_inference_mode_enabled() == (grad_off.name == "inference_mode")
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    for hs in (got, one):
        torch.testing.assert_close(hs.trial_scores, plain.trial_scores, rtol=0, atol=0)


def _swappable(model, seed: int, answer_in_needle: bool = True) -> Trial:
    """A 30-token trial, answer ``"the"``, needle [5, 9) holding the one token of
    ``" the"`` at 6 (none of its other tokens spells it), so ``name_swap`` can swap it
    for ``" Yuki"`` (one token too); without it with ``answer_in_needle=False``."""
    tokens = [300 + (7 * i + seed) % 80 for i in range(30)]
    if answer_in_needle:
        (tokens[6],) = model.tokenizer.encode(" the", add_special_tokens=False)
    return Trial(tokens=tokens, needle_span=(5, 9), answer="the").with_tokenizer(model)


def test_atp_refuses_bad_trials_before_any_forward(qwen3, forward_count) -> None:
    """``name_swap`` on a last trial whose needle lacks the answer is refused before any
    forward pass, by index and id (it failed after the other trials ran, naming none);
    two bad trials are named in one error."""
    good = [_swappable(qwen3, seed) for seed in range(3)]
    bad = _swappable(qwen3, 3, answer_in_needle=False)
    kw = dict(corruption="name_swap", answer_position="prompt_end", progress=False)
    with pytest.raises(lt.TrialError, match=rf"^atp_heads: trial 3 \({bad.trial_id}\): answer "
                       r"'the' does not occur in the needle tokens \(corruption='name_swap'\)$"):
        atp_heads(qwen3, [*good, bad], **kw)
    n_ctx = int(qwen3.cfg.n_ctx)
    long = Trial(tokens=[300] * (n_ctx + 1), needle_span=(5, 9), answer="the").with_tokenizer(qwen3)
    with pytest.raises(lt.TrialError) as err:
        atp_heads(qwen3, [good[0], bad, good[1], long], **kw)
    assert str(err.value).splitlines() == [
        "atp_heads: 2 of 4 trials cannot run:",
        f"  trial 1 ({bad.trial_id}): answer 'the' does not occur in the needle tokens "
        "(corruption='name_swap')",
        f"  trial 3 ({long.trial_id}): prompt of {n_ctx + 1} tokens + 1 new tokens is longer "
        f"than the model's context n_ctx={n_ctx}; answer 'the' does not occur in the needle "
        "tokens (corruption='name_swap')",
    ]
    assert forward_count.n == 0
    hs = atp_heads(qwen3, good, **kw)  # the good trials alone run, and the count sees it
    assert hs.meta["n_accepted"] == 3 and forward_count.n > 0


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_atp_recomputes_each_layer_and_keeps_the_full_backward_s_scores(
        windowed, arch, monkeypatch) -> None:
    """The corrupted run's backward recomputes each decoder layer (its attention output
    projection runs twice a layer) over a frozen prefix cache whose sliding windows (8
    tokens) are shorter than the 26-token shared prefix, and the scores equal, bit for
    bit, those of the plain backward that keeps the whole graph (same operations on the
    same inputs); the prefix cache is left as it was."""
    import contextlib

    import locos_tl.experiments.atp as atp_mod
    from locos_tl.engine.twin import sdpa_twin

    model = windowed(arch)
    g = torch.Generator().manual_seed(5)
    # the needle ends 4 tokens before the last position, inside every window
    tokens = torch.randint(1, int(model.cfg.d_vocab) - 1, (34,), generator=g).tolist()
    t = Trial(tokens=tokens, needle_span=(26, 30), answer="the")
    twin = sdpa_twin(model)
    assert twin is not None
    calls = [0]
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda *_: calls.__setitem__(0, calls[0] + 1)) for layer in twin.model.layers]
    try:
        rec = atp_trial(model, t, answer_position="prompt_end")
        recomputed = calls[0]
        calls[0] = 0
        with monkeypatch.context() as m:
            m.setattr(atp_mod, "checkpointed_layers", lambda layers: contextlib.nullcontext())
            m.setattr(atp_mod, "frozen_cache", lambda cache: cache)
            plain = atp_trial(model, t, answer_position="prompt_end")
        kept = calls[0]
    finally:
        for h in handles:
            h.remove()
    L = int(model.cfg.n_layers)
    assert rec["shared_prefix"] == 26 and rec["accepted"]
    # shared prefix, clean and corrupted runs (L each) + the recomputation (L)
    assert (recomputed, kept) == (4 * L, 3 * L)
    a, b = torch.tensor(rec["scores"]["atp"]), torch.tensor(plain["scores"]["atp"])
    assert a.abs().max() > 0  # a real signal
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert rec["metric_corrupted"] == plain["metric_corrupted"]
    assert all(not any(type(v).__name__ == "partial" for v in layer.__dict__.values())
               for layer in twin.model.layers)  # the layers' own forward is back


def test_frozen_cache_returns_an_update_s_states_and_stores_nothing(windowed) -> None:
    """frozen_cache: each call returns what a real update returns (sliding layers
    included), twice alike, and the cache keeps its prefix."""
    from locos_tl.engine.forward import _new_cache
    from locos_tl.engine.recompute import frozen_cache
    from locos_tl.engine.twin import sdpa_twin

    model = windowed("gemma3")
    twin = sdpa_twin(model)
    ids = torch.randint(1, 200, (1, 20), generator=torch.Generator().manual_seed(0))
    real, frozen = _new_cache(model), _new_cache(model)
    with torch.no_grad():
        twin(ids, past_key_values=real, use_cache=True)
        twin(ids, past_key_values=frozen, use_cache=True)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in frozen.layers]
    frozen_cache(frozen)
    new_k = torch.randn_like(real.layers[0].keys[:, :, :3])
    new_v = torch.randn_like(new_k)
    assert any(type(layer).__name__ == "DynamicSlidingWindowLayer" for layer in real.layers)
    for i, layer in enumerate(frozen.layers):
        want = real.layers[i].update(new_k, new_v)
        for _ in range(2):
            got = layer.update(new_k, new_v)
            torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
            torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        torch.testing.assert_close(layer.keys, before[i][0], rtol=0, atol=0)
        torch.testing.assert_close(layer.values, before[i][1], rtol=0, atol=0)


def test_atp_vs_cri_publishes_its_scores_beside_the_comparison_not_over_heads_atp(tmp_path):
    """experiments/atp_vs_cri.py saves AtP over the CRI trials in ``<publish>/atp``: a
    run's ``heads/atp`` (AtP of its detection trials, the scores extra_rankings.py
    ablates) keeps its trials and scores, and a ``heads`` folder is refused."""
    import importlib.util

    import pandas as pd

    from locos_tl.heads import HeadScores

    script = Path(__file__).resolve().parents[1] / "experiments" / "atp_vs_cri.py"
    spec = importlib.util.spec_from_file_location("atp_vs_cri", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = torch.Generator().manual_seed(0)
    run = tmp_path / "run"
    detection = HeadScores("atp", torch.randn(5, 2, 3, generator=g, dtype=torch.float64),
                           trial_ids=[f"d{i}" for i in range(5)])
    detection.save(run / "heads" / "atp")
    on_cri = HeadScores("atp", torch.randn(2, 2, 3, generator=g, dtype=torch.float64),
                        trial_ids=["d1", "d3"])
    pooled = pd.DataFrame({"bucket": ["all"], "spearman": [0.5]})
    per_trial = pd.DataFrame({"trial_id": ["d1", "d3"], "spearman": [0.25, 0.75]})
    folder = mod.publish(run / "patch", pooled, per_trial, on_cri)
    assert folder == run / "patch" / "atp"
    kept = HeadScores.load(run / "heads" / "atp")
    assert kept.trial_ids == detection.trial_ids
    torch.testing.assert_close(kept.trial_scores, detection.trial_scores, rtol=0, atol=0)
    saved = HeadScores.load(folder)
    assert saved.trial_ids == ["d1", "d3"]
    torch.testing.assert_close(saved.trial_scores, on_cri.trial_scores, rtol=0, atol=0)
    assert pd.read_csv(run / "patch" / "atp_per_trial.csv")["spearman"].tolist() == [0.25, 0.75]
    assert pd.read_csv(run / "patch" / "agreement_atp_cri.csv")["spearman"].tolist() == [0.5]
    with pytest.raises(ValueError, match="heads folder, whose atp is the AtP of the run's "
                                         "detection trials"):
        mod.publish(run / "heads", pooled, per_trial, on_cri)
    assert HeadScores.load(run / "heads" / "atp").trial_ids == detection.trial_ids
