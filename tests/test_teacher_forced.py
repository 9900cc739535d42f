"""The teacher-forced sweep (locos_tl.experiments.teacher_forced) and its engine
(locos_tl.engine.teacher_forcing): no decoding, the same numbers as decoding.

``continuation_logprobs`` runs the prefill and the continuation forwards that
``greedy_decode(score_continuations=...)`` runs, so the two agree bit for bit; with a
prefix the prompt is computed from the lowest ablated layer, bit for bit the full
prefill (tests/test_prefix.py). Independent check: the batched full-sequence forward of
prompt + continuation (``name_logprobs``) within float32 summation noise.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from locos_tl import Trial
from locos_tl.engine.ablation import ablate, calibrate_means
from locos_tl.engine.decode import greedy_decode
from locos_tl.engine.prefix import prompt_prefix
from locos_tl.engine.teacher_forcing import continuation_logprobs
from locos_tl.errors import TrialError
from locos_tl.experiments.margin import name_logprobs
from locos_tl.models.tiny import SHORT_WINDOWS

PROMPT = torch.randint(1, 380, (1, 40), generator=torch.Generator().manual_seed(5)).tolist()[0]
HEAD_SETS = {"from1": [(1, 2), (3, 0)], "from3": [(3, 3)], "from0": [(0, 1)], "none": []}
CONTS = [[5, 9, 11], [17], [200, 3]]


@pytest.fixture(scope="module")
def deep(deep_windowed):
    cache: dict[str, tuple] = {}

    def get(arch: str):
        if arch not in cache:
            model = deep_windowed(arch)
            cache[arch] = (model, calibrate_means(model, [PROMPT[:30], list(range(7, 50))]))
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", list(SHORT_WINDOWS))
def test_teacher_forcing_equals_the_decodings_scores_and_a_full_forward(deep, arch):
    model, means = deep(arch)
    prefix = prompt_prefix(model, PROMPT, [h for h in HEAD_SETS.values() if h])
    for name, heads in HEAD_SETS.items():
        with ablate(model, heads, "query_mean", means=means):
            decoded = greedy_decode(model, PROMPT, max_new_tokens=2,
                                    score_continuations=CONTS).continuation_logprobs
            plain = continuation_logprobs(model, PROMPT, CONTS)
            reused = continuation_logprobs(model, PROMPT, CONTS, prefix=prefix)
            full = name_logprobs(model, PROMPT, CONTS)
        assert plain == decoded and reused == decoded, name  # same kernels, same inputs
        # another computation (one batched full-sequence forward): float32 summation
        # order over 40 positions and 4 layers, log-probabilities of order 10 nats
        torch.testing.assert_close(torch.tensor(reused), full.to(torch.float32),
                                   rtol=0, atol=1e-4)
        assert len(set(decoded)) == 3  # the three continuations differ


def test_teacher_forcing_refuses_bad_input(deep):
    model, _ = deep("llama")
    with pytest.raises(TrialError, match="no tokens"):
        continuation_logprobs(model, PROMPT, [[]])
    with pytest.raises(TrialError, match="empty prompt"):
        continuation_logprobs(model, [], [[3]])
    with pytest.raises(TrialError, match="integer"):
        continuation_logprobs(model, torch.ones(4), [[3]])
    with pytest.raises(TrialError, match="n_ctx"):
        continuation_logprobs(model, PROMPT, [[3] * int(model.cfg.n_ctx)])


def _trials(model, distractors: bool) -> list[Trial]:
    tok = model.tokenizer
    out = []
    for i in range(3):
        meta = {"character": "Yuki"}
        if distractors:
            meta["distractor_names"] = ["Hana", "Omar"]
        out.append(Trial(tokens=PROMPT[i:], needle_span=(3, 6), answer="Yuki",
                         trial_id=f"t{i}", meta=meta))
    assert tok("Yuki", add_special_tokens=False).input_ids  # the names tokenize
    return out


def test_sweep_margins_equal_the_ablation_sweeps(deep, tmp_path):
    """Same cells, same margins as the decoding sweep, bit for bit; reuse on or off."""
    from locos_tl import ablation_sweep, teacher_forced_sweep

    model, means = deep("gemma3")
    trials = _trials(model, distractors=True)
    ranking = {"m": [(3, 1), (2, 0), (1, 2), (0, 3)]}
    grid = dict(k=[1, 3], seeds=[0], means=means, progress=False)
    tf = {reuse: teacher_forced_sweep(model, trials, ranking, reuse_prefix=reuse,
                                      out_dir=tmp_path / f"tf{reuse}", **grid)
          for reuse in (True, False)}
    assert tf[True].equals(tf[False])
    dec = ablation_sweep(model, trials, ranking, max_new_tokens=2, out_dir=tmp_path / "dec",
                         scorer=lambda r, t: {"len": float(len(r))}, **grid)
    a = tf[True][tf[True].metric == "name_margin"].set_index(["method", "k", "seed"])
    b = dec[dec.metric == "name_margin"].set_index(["method", "k", "seed"])
    assert len(a) == len(b) == 1 + 2 + 2  # baseline, m and random at k 1 and 3
    assert (a["value"] == b.loc[a.index, "value"]).all()
    assert set(tf[True].metric) == {"logp_answer", "name_margin"}
    assert (tf[True].n_trials == 3).all()
    recs = [json.loads(x) for x in (tmp_path / "tfTrue" / "trials.jsonl").read_text()
            .splitlines()]
    assert len(recs) == 5 * 3 and all(r["logp_answer"] <= 0 for r in recs)
    assert all(r["name_margin"] == r["logp_target"] - r["logp_best_distractor"]
               for r in recs)



def test_a_sweep_recorded_without_margins_gets_them_teacher_forced(deep, tmp_path):
    """Generations recorded without a name margin (Ray workers before they scored it)
    get it on the next call, bit for bit the margin a decoding records, with no new
    generation; the record's later line carries it."""
    from locos_tl import ablation_sweep

    model, means = deep("gemma3")
    trials = _trials(model, distractors=True)
    grid = dict(k=[1, 3], seeds=[0], means=means, progress=False, max_new_tokens=2,
                scorer=lambda r, t: {"len": float(len(r))})
    ranking = {"m": [(3, 1), (2, 0), (1, 2), (0, 3)]}
    decoded = ablation_sweep(model, trials, ranking, out_dir=tmp_path / "dec", **grid)
    bare = ablation_sweep(model, trials, ranking, out_dir=tmp_path / "run",
                          name_margin=False, **grid)
    assert "name_margin" not in set(bare.metric)
    lines = (tmp_path / "run" / "trials.jsonl").read_text().splitlines()
    assert len(lines) == 5 * 3 and not any("name_margin" in x for x in lines)
    filled = ablation_sweep(model, trials, ranking, out_dir=tmp_path / "run", **grid)
    pd.testing.assert_frame_equal(filled, decoded)  # margins equal, bit for bit
    recs = [json.loads(x) for x in
            (tmp_path / "run" / "trials.jsonl").read_text().splitlines()]
    assert len(recs) == 2 * 5 * 3  # one later line each, nothing generated again
    want = {r["trial_id"]: r for r in map(json.loads, (tmp_path / "dec" / "trials.jsonl")
                                          .read_text().splitlines())}
    for old, new in zip(recs[:15], recs[15:], strict=True):
        assert new == {**old, "name_margin": want[old["trial_id"]]["name_margin"]}
    again = ablation_sweep(model, trials, ranking, out_dir=tmp_path / "run", **grid)
    pd.testing.assert_frame_equal(again, decoded)
    assert len((tmp_path / "run" / "trials.jsonl").read_text().splitlines()) == 30

def test_sweep_resumes_and_refuses_other_settings(deep, tmp_path):
    from locos_tl import teacher_forced_sweep
    from locos_tl.errors import LocosError

    model, means = deep("llama")
    trials = _trials(model, distractors=False)
    args = dict(k=[1], seeds=[0], means=means, progress=False, out_dir=tmp_path)
    first = teacher_forced_sweep(model, trials, {"m": [(2, 1), (1, 0)]}, **args)
    assert set(first.metric) == {"logp_answer"}  # no distractors, no margin
    n = len((tmp_path / "trials.jsonl").read_text().splitlines())
    again = teacher_forced_sweep(model, trials, {"m": [(2, 1), (1, 0)]}, **args)
    assert again.equals(first)
    assert len((tmp_path / "trials.jsonl").read_text().splitlines()) == n  # nothing redone
    with pytest.raises(LocosError, match="other settings"):
        teacher_forced_sweep(model, trials, {"m": [(2, 1)]}, mode="query_zero",
                             **{**args, "means": None})
    with pytest.raises(ValueError, match="needs calibration means"):
        teacher_forced_sweep(model, trials, {"m": [(2, 1)]}, k=[1], progress=False)
    with pytest.raises(TrialError, match="no trial"):
        teacher_forced_sweep(model, [], {"m": [(2, 1)]}, k=[1], means=means, progress=False)
    seen = []
    teacher_forced_sweep(model, trials, {"m": [(2, 1), (1, 0)]}, **args,
                         on_resume=lambda n, total: seen.append((n, total)))
    assert seen == [(n, n)]  # every cell reused


def test_sweep_warns_and_records_a_k_beyond_a_ranking(deep, tmp_path):
    from locos_tl import teacher_forced_sweep

    model, means = deep("llama")
    trials = _trials(model, distractors=False)[:1]
    with pytest.warns(UserWarning, match=r"fewer heads than k=\[3\]"):
        df = teacher_forced_sweep(model, trials, {"m": [(2, 1), (1, 0)]}, k=[1, 3],
                                  seeds=[0], random=False, means=means, progress=False,
                                  out_dir=tmp_path)
    assert sorted(zip(df.method, df.k, strict=True)) == [("baseline", 0), ("m", 1)]
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["settings"]["skipped_k"] == {"m": [3]}


def test_cli_ablate_tf_writes_the_table_and_resumes(tmp_path):
    import pandas as pd
    from typer.testing import CliRunner

    from locos_tl import save_trials
    from locos_tl.cli import app
    from locos_tl.organisms import SMALL_ORGANISM, make_trials

    trials = save_trials(make_trials("nonliteral", 3, 64, seed=1), tmp_path / "t.jsonl")
    out = tmp_path / "run"
    args = ["ablate-tf", "--model", SMALL_ORGANISM, "--trials", str(trials), "--out",
            str(out), "--heads", "w=L1H0,L0H3", "--k", "1,2", "--seeds", "0",
            "--bottom", "none"]
    res = CliRunner().invoke(app, [*args, "--mode", "query_zero"])
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "evaluation.csv")
    assert set(df.metric) == {"logp_answer"} and (df.n_trials == 3).all()
    cells = sorted(zip(df.method, df.k, strict=True))
    assert cells == [("baseline", 0), ("random", 1), ("random", 2), ("w", 1), ("w", 2)]
    assert (df.value < 0).all()  # log-probabilities of a name, nats
    assert (out / "ablation.html").exists()
    n = len((out / "trials.jsonl").read_text().splitlines())
    res = CliRunner().invoke(app, [*args, "--mode", "query_zero"])
    assert res.exit_code == 0, res.output
    assert len((out / "trials.jsonl").read_text().splitlines()) == n == 5 * 3
    res = CliRunner().invoke(app, args)  # query_mean without --means
    assert res.exit_code == 2 and "needs --means" in res.output
