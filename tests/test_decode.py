"""Greedy decoding through the bridge matches Hugging Face generation token for token.

Also the regression guard for the transformers 5.24 bug (TransformerLens 4.3's cached
decode steps saw only 1 key and produced different tokens): every decode-step attention
row must span all N_t keys and sum to 1. And the one greedy loop every decoder drives
(:func:`locos_tl.engine.greedy.greedy_loop`) on a scripted forward: picks, budget,
forcing, stops, rows dropped as they stop, NaN raised or dropped.
"""

import pytest
import torch
from tolerances import assert_close_within, model_tol

from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.forward import prefill
from locos_tl.engine.greedy import greedy_loop
from locos_tl.engine.stops import StopRules
from locos_tl.errors import NonFiniteError, TrialError


def _prompt(model, n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, int(model.cfg.d_vocab) - 1, (n,), generator=g).tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "olmo2"])
@pytest.mark.parametrize("prefill_mode", ["sdpa", "bridge"])
def test_greedy_matches_hf_generate(tiny_models, arch, prefill_mode):
    model = tiny_models(arch)
    tokens = _prompt(model)
    steps = []
    res = greedy_decode(model, tokens, max_new_tokens=10, stop_rule="none",
                        stop_at_eos=False, prefill_mode=prefill_mode, chunk_size=8,
                        on_step=steps.append)
    hf = model.original_model
    ids = torch.tensor([tokens])
    for use_cache in (True, False):
        out = hf.generate(ids, max_new_tokens=10, do_sample=False, use_cache=use_cache,
                          eos_token_id=None, pad_token_id=0)
        assert res.generated == out[0, len(tokens):].tolist(), (arch, use_cache)
    # no step callback: the steps run on the SDPA twin, the same tokens
    plain = greedy_decode(model, tokens, max_new_tokens=10, stop_rule="none",
                          stop_at_eos=False, prefill_mode=prefill_mode, chunk_size=8)
    assert plain.generated == res.generated
    for t, s in enumerate(steps):
        n_keys = len(tokens) + t
        assert s.pattern.shape == (model.cfg.n_layers, model.cfg.n_heads, n_keys)
        ones = torch.ones(model.cfg.n_layers, model.cfg.n_heads)
        torch.testing.assert_close(s.pattern.sum(-1), ones)
        assert all(v.shape[0] == n_keys for v in s.values)
        assert s.key_tokens.tolist() == tokens + res.generated[:t]


def test_chunked_prefill_equals_full_forward(qwen3):
    tokens = torch.tensor([_prompt(qwen3, 40, seed=3)])
    cache_sdpa = prefill(qwen3, tokens[:, :-1], mode="sdpa")
    cache_chunk = prefill(qwen3, tokens[:, :-1], mode="bridge", chunk_size=16)
    n = tokens.shape[1]
    for l, (a, b) in enumerate(zip(cache_sdpa.layers, cache_chunk.layers, strict=True)):
        assert_close_within(a.values, b.values, model_tol(qwen3, b.values, n_tokens=n,
                                                          layers=l), f"values L{l}")
        assert_close_within(a.keys, b.keys, model_tol(qwen3, b.keys, n_tokens=n, layers=l),
                            f"keys L{l}")
    with torch.no_grad():
        full = qwen3(tokens, return_type="logits")[0, -1]
        step = qwen3(tokens[:, -1:], past_key_values=cache_chunk, return_type="logits")[0, -1]
    assert_close_within(step, full, model_tol(qwen3, full, n_tokens=n), "cached step logits")
    with pytest.raises(ValueError, match="unknown prefill mode"):
        prefill(qwen3, tokens, mode="fast")


def test_stops_at_eos_and_newline(qwen3):
    tok = qwen3.tokenizer
    tokens = _prompt(qwen3)
    free = greedy_decode(qwen3, tokens, max_new_tokens=6, stop_rule="none", stop_at_eos=False)
    # force an EOS as the 3rd token: decoding must stop right after it
    forced = free.generated[:2] + [tok.eos_token_id] + free.generated[2:]
    res = greedy_decode(qwen3, tokens, max_new_tokens=6, forced_tokens=forced)
    assert res.generated == forced[:3] and res.stopped_by == "eos"
    nl = tok.encode("\n", add_special_tokens=False)[0]
    res = greedy_decode(qwen3, tokens, max_new_tokens=6, forced_tokens=[forced[0], nl, 5, 6])
    assert res.generated == [forced[0], nl] and res.stopped_by == "newline"
    assert "\n" not in res.text


def test_context_length_checked(qwen3):
    n_ctx = qwen3.cfg.n_ctx
    with pytest.raises(TrialError, match="n_ctx"):
        greedy_decode(qwen3, [1] * (n_ctx - 5), max_new_tokens=10)
    with pytest.raises(TrialError, match="empty prompt"):
        greedy_decode(qwen3, [], max_new_tokens=3)


class _Scripted:
    """A forward for :func:`greedy_loop` whose row ``b`` picks ``script[b][t]`` at step
    ``t`` (``None``: NaN logits); it records every call's ``(t, rows, last)``."""

    def __init__(self, scripts, d_vocab=256):
        self.scripts, self.d_vocab, self.calls = scripts, d_vocab, []

    def __call__(self, t, rows, last):
        self.calls.append((t, list(rows), None if last is None else list(last)))
        logits = torch.zeros(len(rows), self.d_vocab)
        for j, b in enumerate(rows):
            y = self.scripts[b][t]
            if y is None:
                logits[j, 3] = float("nan")
            else:
                logits[j, y] = 10.0
        return logits


def test_greedy_loop_picks_stops_and_drops_rows(qwen3):
    tok = qwen3.tokenizer
    nl, eos = tok.encode("\n", add_special_tokens=False)[0], tok.eos_token_id
    assert nl < 256 and eos < 256 and not {5, 6, 7} & {nl, eos}
    rules = StopRules(tok, frozenset({eos}), frozenset(), frozenset(), "newline_token")
    scripts = [[5, 6, nl, 7], [7, eos, 5, 5], [5, 5, 5, 5, 5], [6, None, 5, 5]]
    fwd = _Scripted(scripts)
    tokens, done = [], []
    rows = greedy_loop(fwd, [[1, 2, 3], [4, 5], [1], [2, 2]], rules, max_new_tokens=4,
                       on_token=lambda *a: tokens.append(a),
                       on_done=lambda i, r: done.append((i, r.state.stopped_by)),
                       non_finite="drop")
    # each step feeds the rows still decoding their own last token
    assert fwd.calls == [(0, [0, 1, 2, 3], None), (1, [0, 1, 2, 3], [5, 7, 5, 6]),
                         (2, [0, 2], [6, 5]), (3, [2], [5])]
    assert done == [(1, "eos"), (3, "non_finite"), (0, "newline"), (2, "max_new_tokens")]
    assert [r.generated for r in rows] == [[5, 6, nl], [7, eos], [5] * 4, [6]]
    assert [r.result.stopped_by for r in rows[:3]] == ["newline", "eos", "max_new_tokens"]
    assert rows[0].result.text == tok.decode([5, 6]).strip()
    assert rows[0].result.prompt_len == 3 and rows[1].result.text == tok.decode([7]).strip()
    assert rows[3].result is None
    assert rows[3].non_finite.startswith("decoding step 1: the logits hold NaN or inf "
                                         "(dtype torch.float32")
    # on_token sees every chosen token, the stop tokens included, before the stop
    assert [(i, t, y) for i, t, y, _ in tokens if i == 1] == [(1, 0, 7), (1, 1, eos)]
    assert len(tokens) == 3 + 2 + 4 + 1 and not any(th for *_, th in tokens)

    # the default raises, naming the step
    with pytest.raises(NonFiniteError, match=r"compressed decoding step 1: the logits hold"):
        greedy_loop(_Scripted([[6, None]]), [[1]], rules, max_new_tokens=3,
                    what="compressed decoding")
    # forcing replaces the pick (and stops by the forced tokens), not the NaN check
    forced = greedy_loop(_Scripted([[5] * 5]), [[1]], rules, max_new_tokens=5,
                         forced_tokens=[7, 6, nl, 5])
    assert forced[0].generated == [7, 6, nl] and forced[0].result.stopped_by == "newline"
    short = greedy_loop(_Scripted([[5] * 5]), [[1]], rules, max_new_tokens=5,
                        forced_tokens=[7, 6])
    assert short[0].generated == [7, 6] and short[0].result.stopped_by == "max_new_tokens"
    with pytest.raises(NonFiniteError, match="step 0"):
        greedy_loop(_Scripted([[None]]), [[1]], rules, max_new_tokens=1, forced_tokens=[7])
    none = StopRules(tok, frozenset(), frozenset(), frozenset(), "none")
    free = greedy_loop(_Scripted([[nl, eos, nl]]), [[1]], none, max_new_tokens=3)
    assert free[0].generated == [nl, eos, nl] and free[0].result.stopped_by == "max_new_tokens"
    for bad in (0, -2, True):
        with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1"):
            greedy_loop(_Scripted([[5]]), [[1]], rules, max_new_tokens=bad)
    with pytest.raises(ValueError, match="forced_tokens needs one prompt"):
        greedy_loop(_Scripted([[5], [5]]), [[1], [2]], rules, max_new_tokens=1,
                    forced_tokens=[5])


def test_decode_options_are_one_checked_object(qwen3):
    """``greedy_decode``'s keywords build one :class:`DecodeOptions`: the object and the
    keywords decode the same tokens, a keyword overrides the object, a near miss is
    named, the object is frozen and reads back from its settings."""
    import dataclasses

    from locos_tl.engine.options import DecodeOptions

    prompt = _prompt(qwen3, n=12)
    opts = DecodeOptions(max_new_tokens=4, stop_rule="none", stop_at_eos=False)
    a = greedy_decode(qwen3, prompt, opts)
    b = greedy_decode(qwen3, prompt, max_new_tokens=4, stop_rule="none", stop_at_eos=False)
    assert a.generated == b.generated and len(a.generated) == 4
    assert a.stopped_by == b.stopped_by == "max_new_tokens"
    assert greedy_decode(qwen3, prompt, opts, max_new_tokens=2).generated == a.generated[:2]
    with pytest.raises(TypeError, match=r"greedy_decode\(\) got unknown keyword\(s\) "
                                        r"\['max_new_token'\]; did you mean max_new_tokens"):
        greedy_decode(qwen3, prompt, max_new_token=2)
    for bad, match in (({"chunk_size": 0}, "chunk_size must be None or an integer >= 1"),
                       ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1")):
        with pytest.raises(ValueError, match=match):
            DecodeOptions(**bad)
    for bad in ({"decode_engine": "fast"}, {"prefill_mode": "eager"}, {"stop_rule": "eos"}):
        # ValueError naming the choices; the tests' runtime type checker (the fields are
        # Literal) refuses them first with a TypeError
        with pytest.raises((ValueError, TypeError)):
            DecodeOptions(**bad)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.max_new_tokens = 8  # type: ignore[misc]
    settings = opts.settings()
    assert settings == {"max_new_tokens": 4, "stop_rule": "none", "thinking": True,
                        "stop_at_eos": False, "prefill_mode": "auto", "chunk_size": None,
                        "decode_engine": "auto"}
    assert DecodeOptions.from_settings({**settings, "model": "tiny", "seed": 3}) == opts
