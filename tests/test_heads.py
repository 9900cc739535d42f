"""HeadScores aggregation, rankings, bootstrap CI and file formats."""

import json

import pytest
import torch

from locos_tl import HeadScores
from locos_tl.errors import DataFormatError


def _records():
    # 3 accepted trials, 1 dropped; 2 layers x 3 heads
    base = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    recs = []
    for i, shift in enumerate([0.0, 1.0, 2.0]):
        s = (base + shift).tolist()
        recs.append({"trial_id": f"t{i}", "accepted": True, "scores": {"locos": s},
                     "step_values": {"locos": [s, s]}})
    recs.append({"trial_id": "t3", "accepted": False, "scores": {}, "step_values": {}})
    return recs


def test_from_records_mean_pooled_and_ranking():
    hs = HeadScores.from_records(_records(), "locos", n_layers=2, n_heads=3)
    assert hs.n_trials == 3 and hs.trial_ids == ["t0", "t1", "t2"]
    expected = torch.arange(6, dtype=torch.float64).reshape(2, 3) + 1.0
    torch.testing.assert_close(hs.scores, expected)
    torch.testing.assert_close(hs.pooled, expected)
    assert hs.top_k(2) == [(1, 2), (1, 1)]
    assert hs.bottom_k(1) == [(0, 0)]
    low, high = hs.ci
    assert bool((low <= hs.scores).all() and (hs.scores <= high).all())
    # per-trial spread is 2 around each mean: the CI lies within [min, max] of trials
    width = torch.full((2, 3), high[0, 0] - low[0, 0], dtype=torch.float64)
    torch.testing.assert_close(high - low, width)
    assert 0 < (high - low)[0, 0] <= 2.0


def test_bootstrap_is_seeded():
    hs = HeadScores(method="locos", trial_scores=torch.randn(20, 2, 2), seed=5)
    again = HeadScores(method="locos", trial_scores=hs.trial_scores.clone(), seed=5)
    other = HeadScores(method="locos", trial_scores=hs.trial_scores.clone(), seed=6)
    torch.testing.assert_close(hs.ci[0], again.ci[0])
    assert not torch.equal(hs.ci[0], other.ci[0])


def test_to_frame_columns_and_order():
    hs = HeadScores.from_records(_records(), "locos", n_layers=2, n_heads=3, variant="raw")
    df = hs.to_frame()
    for col in ["layer", "head", "score", "ci_low", "ci_high", "n_trials", "method", "variant"]:
        assert col in df.columns
    assert df.iloc[0][["layer", "head", "label"]].tolist() == [1, 2, "L1H2"]
    assert df["score"].is_monotonic_decreasing and len(df) == 6
    assert set(df["n_trials"]) == {3}


def test_save_load_and_reference_json(tmp_path):
    hs = HeadScores.from_records(_records(), "locos", n_layers=2, n_heads=3, variant="exact",
                                 meta={"model": "m"})
    hs.save(tmp_path)
    back = HeadScores.load(tmp_path)
    torch.testing.assert_close(back.trial_scores, hs.trial_scores)
    assert back.variant == "exact" and back.meta == {"model": "m"}
    ref = json.loads((tmp_path / "heads.json").read_text())
    assert ref["1-2"] == [5.0, 6.0, 7.0] and len(ref) == 6
    read = HeadScores.from_reference_json(tmp_path / "heads.json")
    torch.testing.assert_close(read.scores, hs.scores)


def test_reference_json_unequal_lengths_and_errors(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"0-0": [1.0, 3.0], "0-1": [5.0], "1-1": [0.0]}))
    hs = HeadScores.from_reference_json(p)
    assert (hs.n_layers, hs.n_heads, hs.n_trials) == (2, 2, 2)
    assert hs.scores[0, 0].item() == 2.0 and hs.scores[0, 1].item() == 5.0
    assert torch.isnan(hs.scores[1, 0])
    assert hs.top_k(1) == [(0, 1)] and (1, 0) == hs.ranked()[-1]
    p.write_text(json.dumps({"zero": [1.0]}))
    with pytest.raises(DataFormatError, match="not a head-score file"):
        HeadScores.from_reference_json(p)
    with pytest.raises(FileNotFoundError):
        HeadScores.load(tmp_path / "nothing")


def test_zero_accepted_trials_round_trip(tmp_path):
    hs = HeadScores.from_records([{"trial_id": "a", "accepted": False}], "locos",
                                 n_layers=2, n_heads=3)
    assert hs.n_trials == 0 and torch.isnan(hs.scores).all()
    back = HeadScores.load(hs.save(tmp_path))
    assert back.trial_scores.shape == (0, 2, 3) and torch.isnan(back.scores).all()
