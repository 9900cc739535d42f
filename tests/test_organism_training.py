"""Training machinery of the organisms: skip-wise positions, the attention
mask they need, warm start by layer duplication, resumable checkpoints, valid ranges."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from tolerances import assert_close_within, sum_tol

from locos_tl.organisms import SMALL_ORGANISM, make_trials, organism_path
from locos_tl.organisms import analysis as A
from locos_tl.organisms.lengths import valid_range
from locos_tl.organisms.positions import skip_positions
from locos_tl.organisms.recipes import PRESETS, parse_args
from locos_tl.organisms.train import TrainConfig, build_model, train


@pytest.mark.parametrize("seed", range(20))
def test_skip_positions_span_the_target_and_keep_chunks_consecutive(seed):
    rng = np.random.default_rng(seed)
    n, target = 50, 50 + int(rng.integers(0, 4000))
    forbidden = rng.random(n) < 0.3
    pos = skip_positions(rng, n, target, forbidden=forbidden, last_boundary=45)
    assert pos[0] == 0 and pos[-1] == target - 1
    d = np.diff(pos)
    assert (d >= 1).all()
    jumps = np.nonzero(d > 1)[0] + 1  # boundaries: first token of a shifted chunk
    assert len(jumps) <= 3
    assert all(2 <= b <= 45 and not forbidden[b] for b in jumps)
    assert int((d - 1).sum()) == target - n


def test_skip_positions_identity_and_bad_target():
    rng = np.random.default_rng(0)
    assert (skip_positions(rng, 30, 30) == np.arange(30)).all()
    with pytest.raises(ValueError, match="shorter than the sequence"):
        skip_positions(rng, 30, 29)


@pytest.fixture(scope="module")
def tiny_cfg():
    return TrainConfig(steps=4, batch_size=4, n_layers=1, d_model=32, n_heads=2,
                       n_kv_heads=1, d_head=16, d_mlp=32, lengths=[(1.0, 24, 32)],
                       virtual_lengths=[(1.0, 300)], max_position=512, eval_every=3,
                       eval_lengths=(24,), checkpoint_every=2, aux_induction=0.5,
                       lr_schedule="cosine", warmup=2)


def test_skip_positions_need_the_explicit_attention_mask(tiny_cfg):
    """transformers 5 reads jumping position ids as packed sequences when no mask and no
    cache is given (training): the last token would then not see the tokens before the
    jump."""
    model = build_model(tiny_cfg).eval()
    ids = torch.randint(5, 200, (1, 20))
    ids2 = ids.clone()
    ids2[0, 3] = 4  # change a token before the jump
    pos = torch.cat([torch.arange(10), torch.arange(10) + 200])[None]

    def last(x, mask):
        kw = {"attention_mask": torch.ones_like(x)} if mask else {}
        return model(input_ids=x, position_ids=pos, use_cache=False, **kw).logits[0, -1]

    with torch.no_grad():
        assert not torch.allclose(last(ids, True), last(ids2, True))
        # without the mask the jump cuts the sequence in two (what training must avoid)
        assert torch.allclose(last(ids, False), last(ids2, False))
        # RoPE: a constant shift of every position changes nothing (mask given)
        shifted = model(input_ids=ids, position_ids=torch.arange(20)[None] + 77,
                        attention_mask=torch.ones_like(ids)).logits[0, -1]
        plain = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1]
    # the angles p * theta are rounded in float32 (relative error about p * eps, like a
    # sum of p terms, p up to 96), then the layer's sums and the unembedding
    n_sums = 2 * model.config.num_hidden_layers + 1
    assert_close_within(shifted, plain, sum_tol(plain.abs().max(), 20 + 77, n_sums),
                        "RoPE shift")


def test_training_resumes_from_its_checkpoint_bit_for_bit(tiny_cfg, tmp_path):
    full = train(tiny_cfg, None, log=lambda s: None)["model"].state_dict()

    class Stop(Exception):
        pass

    def stop_at_first_eval(line):  # step 3: the step-2 checkpoint exists
        raise Stop

    with pytest.raises(Stop):
        train(tiny_cfg, tmp_path, log=stop_at_first_eval)
    assert (tmp_path / "checkpoint.pt").exists()
    with pytest.raises(ValueError, match=rf"another configuration: lr \(recorded "
                       rf"{re.escape(repr(tiny_cfg.lr))}, now 0\.01\); remove it"):
        train(replace(tiny_cfg, lr=1e-2), tmp_path, log=lambda s: None)
    lines = []
    resumed = train(tiny_cfg, tmp_path, log=lines.append)["model"].state_dict()
    assert lines[0].startswith("resuming from") and "step 2" in lines[0]
    for k in full:
        torch.testing.assert_close(resumed[k], full[k], rtol=0, atol=0)
    assert not (tmp_path / "checkpoint.pt").exists()  # spent once the run completed


def test_warm_start_duplicates_a_layer_and_keeps_the_function():
    cfg = replace(PRESETS["retrieval-long"](), steps=1)
    model = build_model(cfg).eval()
    src = A.load_hf(SMALL_ORGANISM, attn="sdpa")
    w1 = src.model.layers[1].self_attn.o_proj.weight
    for i in (1, 2):
        w = model.model.layers[i].self_attn.o_proj.weight
        assert (w - w1 / 2).abs().max() <= 1e-2 * w1.abs().max()
    torch.testing.assert_close(model.model.layers[2].self_attn.q_proj.weight,
                               src.model.layers[1].self_attn.q_proj.weight)
    trials = make_trials("literal", 40, 64, seed=5) + make_trials("nonliteral", 40, 64, seed=5)
    assert A.accuracy(model, trials) >= 0.85
    assert model.config.max_position_embeddings == 4096
    with pytest.raises(ValueError, match="layer_map"):
        build_model(replace(cfg, layer_map=[0, 1, 2]))


def test_presets_parse_and_flags_override():
    cfg, _ = parse_args(["--preset", "retrieval-long", "--steps", "7"])
    assert cfg.steps == 7 and cfg.n_layers == 3 and cfg.max_position == 4096
    assert cfg.init_from == "data/organisms/retrieval-2l"  # relative: recorded as given
    base, _ = parse_args([])
    assert base == TrainConfig()  # the shipped retrieval-2l configuration
    assert organism_path("retrieval-2l") == SMALL_ORGANISM
    with pytest.raises(KeyError, match="shipped"):
        organism_path("nope")


def test_train_organism_builds_the_config_the_command_line_gives(tmp_path, monkeypatch):
    """``locos train-organism`` builds the training configuration directly
    (:func:`organism_config`, the flags as overrides), and the same as
    ``python -m locos_tl.organisms.train``'s; a refused configuration exits 2 before any
    training, with the reason."""
    from typer.testing import CliRunner

    import locos_tl.organisms.recipes as recipes
    from locos_tl.cli import app
    from locos_tl.errors import ConfigError

    assert recipes.organism_config("retrieval-2l", steps=7, seed=3) == \
        replace(TrainConfig(), steps=7, seed=3) == \
        parse_args(["--steps", "7", "--seed", "3"])[0]
    with pytest.raises(ConfigError, match="staged recipe"):
        recipes.organism_config("retrieval-long", steps=7)
    with pytest.raises(ConfigError, match="not a field of TrainConfig"):
        recipes.organism_config("retrieval-2l", step=7)
    trained = []
    monkeypatch.setattr(recipes, "train", lambda cfg, out, log: trained.append((cfg, out))
                        or {"seconds": 0.0, "final": {}})
    res = CliRunner().invoke(app, ["train-organism", "--steps", "3", "--seed", "5",
                                   "--no-card", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert trained == [(replace(TrainConfig(), steps=3, seed=5), tmp_path)]
    assert not (tmp_path / "MODEL_CARD.md").exists()
    res = CliRunner().invoke(app, ["train-organism", "--preset", "retrieval-long",
                                   "--steps", "3"])
    assert res.exit_code == 2 and "staged recipe" in res.output and len(trained) == 1


def test_valid_range_is_the_longest_run_of_passing_lengths():
    acc = {"synthetic@64": {"literal": 1.0, "nonliteral": 0.99},
           "book@64": {"literal": 1.0, "nonliteral": 0.95},
           "synthetic@128": {"literal": 0.99, "nonliteral": 0.91},
           "book@128": {"literal": 0.96, "nonliteral": 0.89},  # one filler fails: 128 fails
           "synthetic@256": {"literal": 0.97, "nonliteral": 0.95},
           "synthetic@512": {"literal": 0.97, "nonliteral": 0.95},
           "synthetic@1024": {"literal": 0.5, "nonliteral": 0.95}}
    vr = valid_range(acc)
    assert (vr["min_valid"], vr["max_valid"]) == (256, 512)
    assert vr["lengths_failed"] == [128, 1024] and vr["lengths_ok"] == [64, 256, 512]
    none = valid_range({"synthetic@64": {"literal": 0.5, "nonliteral": 1.0}})
    assert none["max_valid"] is None and none["min_valid"] is None


def test_needle_first_puts_the_needle_before_every_entity_and_draws_nothing_more():
    from locos_tl.organisms.tasks import ids_table, make_example

    t = ids_table()
    entities = set(t.names.tolist()) | set(t.landmarks.tolist())
    for seed in range(30):
        r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
        plain = make_example(r1, 300, "literal")
        first = make_example(r2, 300, "literal", needle_first=True)
        # same randomness consumed: the generators are in the same state afterwards
        assert r1.bit_generator.state == r2.bit_generator.state
        assert sorted(plain.ids) == sorted(first.ids)  # same tokens, other order
        s, e = first.needle_span
        assert first.ids[s:e] == [t.t2i[first.name], t.t2i[first.landmark]]
        before = [i for i in first.ids[1:s] if i in entities]
        assert before == []  # nothing entity-like precedes the needle
        assert first.answer_id == plain.answer_id and first.ids[-2:] == plain.ids[-2:]


def test_recorded_configurations_without_newer_fields_still_match():
    """A stage recorded before `p_needle_first` existed is the same run at its default."""
    from dataclasses import asdict

    from locos_tl.organisms.train import _jsonable, _same_config

    old = _jsonable(asdict(TrainConfig()))
    del old["p_needle_first"]
    assert _same_config(old, TrainConfig())
    assert not _same_config(old, replace(TrainConfig(), p_needle_first=0.3))
    assert not _same_config({**old, "lr": 1.0}, TrainConfig())


def test_rope_theta_reaches_the_checkpoint_config_and_changes_positions():
    """`rope_theta` is the RoPE base of the built model (adjusted-base-frequency warm
    starts): same weights, other base -> other logits; the default is the shipped 10000."""
    from locos_tl.organisms.train import model_config

    base = replace(TrainConfig(), n_layers=1, steps=1)
    assert model_config(base).rope_parameters["rope_theta"] == 10000.0
    wide = replace(base, rope_theta=1e5)
    assert model_config(wide).rope_parameters["rope_theta"] == 1e5
    m1, m2 = build_model(base), build_model(wide)
    m2.load_state_dict(m1.state_dict())
    ids = torch.tensor([make_trials("literal", 1, 64)[0].tokens])
    with torch.no_grad():
        a, b = m1(input_ids=ids).logits, m2(input_ids=ids).logits
    # position 0: no rotation at all, the same arithmetic bit for bit
    torch.testing.assert_close(a[:, 0], b[:, 0], atol=0, rtol=0)
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3
