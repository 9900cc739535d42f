"""experiments/recheck_cells.py: published cells generated again, compared token for token."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "recheck_cells.py"


@pytest.fixture(scope="module")
def recheck():
    spec = importlib.util.spec_from_file_location("recheck_cells", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_same_means_reproduce_every_answer_and_a_changed_answer_is_caught(recheck, tmp_path):
    from planted import build_planted, planted_trials

    import locos_tl as lt

    path = build_planted(tmp_path / "m")
    model = lt.load_model(path, device="cpu")
    trials = planted_trials(model.tokenizer, 3)
    run, pub = tmp_path / "run", tmp_path / "pub"
    lt.save_trials(trials, run / "trials" / "eval_direct_1000.jsonl")
    means = lt.calibrate_means(model, ["alpha beta gamma delta", "the cat sat on a mat"])
    means.save(run / "means.safetensors")
    lt.ablation_sweep(model, trials, {"locos": [(0, 0), (0, 1)]}, k=(1,), mode="query_mean",
                means=means, seeds=(0,), bottom=None, max_new_tokens=3, progress=False,
                out_dir=pub / "ablate" / "direct_1000")
    argv = ["--model", str(path), "--run", str(run), "--published", str(pub),
            "--trials", "direct_1000", "--cells", "locos:1", "random:1:0",
            "--max-new-tokens", "3"]
    assert recheck.main(argv) == 0  # 9 answers (baseline too), all identical
    records = pub / "ablate" / "direct_1000" / "trials.jsonl"
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    lines[-1]["generated"] = [t + 1 for t in lines[-1]["generated"]]
    records.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert recheck.main(argv) == 1
    with pytest.raises(SystemExit, match="no published jobs.json names"):
        recheck.main([*argv[:-3], "dla:1", "--max-new-tokens", "3"])
