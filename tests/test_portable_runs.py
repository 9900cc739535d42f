"""A run records its model by name and content hashes, never by the cache path it was
loaded from, so a run directory resumes under another cache root (``LOCOS_CACHE``, another
home, another machine), including run directories written with a cache path and the
published records under ``docs/real_models``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from locos_tl.errors import LocosError

REPO = Path(__file__).resolve().parents[1]
PUBLISHED = REPO / "docs" / "real_models"
SMOLLM2 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def _trials(tok, n: int = 3):
    from locos_tl.trials import Trial

    words = ("the old man reads a book by the window of the little house near the river "
             "while the children walk to the market").split()
    out = []
    for i, name in enumerate(("Katie", "Gary", "Megan")[:n]):
        needle = f"Actually {name} lives there."
        prompt = f"{' '.join(words[i:i + 10])}. {needle} {' '.join(words[i + 5:i + 15])}. Who?"
        out.append(Trial.from_text(tok, prompt, needle, name))
    return out


@pytest.mark.filterwarnings("ignore:.*no (trial was accepted|accepted trial):RuntimeWarning")
def test_a_run_resumes_under_another_cache_root(tiny_zoo, tmp_path, monkeypatch):
    """Scored and ablated under one cache root, a run goes on under another with every
    record reused; nothing it writes names either cache."""
    import locos_tl as lt
    from locos_tl.models import zoo

    def checkpoint_path(model) -> str:  # where it was loaded from
        return str(model.cfg.model_name)

    sha = tiny_zoo.sha256
    first_cache, second_cache = tmp_path / "alice" / "cache", tmp_path / "bob" / "cache"
    monkeypatch.setenv("LOCOS_CACHE", str(first_cache))
    zoo.fetch("tiny-test", log=lambda msg: None)
    model = lt.load_model("tiny-test", device="cpu")
    assert checkpoint_path(model).startswith(str(first_cache))
    trials = _trials(model.tokenizer)
    run, sweep = tmp_path / "run" / "detect", tmp_path / "run" / "ablate"
    first = lt.score_trials(model, trials, method="locos", max_new_tokens=2, out_dir=run,
                            progress=False)
    means = lt.calibrate_means(model, ["alpha beta gamma delta", "the cat sat on a mat"])
    means.save(tmp_path / "run" / "means.safetensors")
    kw = dict(k=(1,), mode="query_mean", seeds=(0,), bottom=None, max_new_tokens=2,
              progress=False)
    lt.ablation_sweep(model, trials, {"m": [(0, 0), (1, 1)]}, means=means, out_dir=sweep,
                      **kw)
    first.save(tmp_path / "run" / "heads")
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert str(tmp_path) not in path.read_bytes().decode("latin-1"), path
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["model"] == meta["model"]["name"] == "tiny-test"
    assert meta["settings"]["model_hashes"] == meta["model"]["hashes"] == {"gguf_sha256": sha}
    assert lt.AblationMeans.load(tmp_path / "run" / "means.safetensors").meta["model"] == \
        "tiny-test"

    # another user's cache: same weights, another path
    shutil.copytree(first_cache, second_cache)
    shutil.rmtree(first_cache)
    monkeypatch.setenv("LOCOS_CACHE", str(second_cache))
    model = lt.load_model("tiny-test", device="cpu")
    assert checkpoint_path(model).startswith(str(second_cache))
    seen: list[tuple[int, int]] = []
    again = lt.score_trials(model, trials, method="locos", max_new_tokens=2, out_dir=run,
                            progress=False, on_resume=lambda *a: seen.append(a))
    lt.ablation_sweep(model, trials, {"m": [(0, 0), (1, 1)]}, out_dir=sweep,
                      means=lt.AblationMeans.load(tmp_path / "run" / "means.safetensors"),
                      on_resume=lambda *a: seen.append(a), **kw)
    assert seen == [(3, 3), (9, 9)]  # every trial, every cell (baseline, m, random) reused
    assert again.trial_ids == first.trial_ids


@pytest.mark.filterwarnings("ignore:.*no (trial was accepted|accepted trial):RuntimeWarning")
def test_a_run_recorded_with_a_cache_path_resumes_elsewhere(tiny_zoo, cache, tmp_path,
                                                            monkeypatch):
    """A run directory written before identities were recorded names its model by the
    cache path of the machine that made it; it resumes here, and a path naming other
    weights is still refused (the message names both identities)."""
    import locos_tl as lt
    from locos_tl.models import zoo

    sha = tiny_zoo.sha256
    zoo.fetch("tiny-test", log=lambda msg: None)
    model = lt.load_model("tiny-test", device="cpu")
    trials = _trials(model.tokenizer, 2)
    run = tmp_path / "run"
    lt.score_trials(model, trials, method="locos", max_new_tokens=2, out_dir=run,
                    progress=False)
    meta_path = run / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["settings"]["model_hashes"]
    meta["settings"]["model"] = f"/home/alice/.cache/locos_tl/gguf/{sha}"  # the old form
    meta_path.write_text(json.dumps(meta))
    seen: list[tuple[int, int]] = []
    lt.score_trials(model, trials, method="locos", max_new_tokens=2, out_dir=run,
                    progress=False, on_resume=lambda *a: seen.append(a))
    assert seen == [(2, 2)]
    meta = json.loads(meta_path.read_text())
    meta["settings"]["model"] = f"/home/alice/.cache/locos_tl/gguf/{SMOLLM2}"
    del meta["settings"]["model_hashes"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(LocosError, match=r"other settings \(model: 'smollm2-135m-instruct' "
                                         r"\(gguf_sha256 b179c9523d0e6a0f\) != 'tiny-test'"):
        lt.score_trials(model, trials, method="locos", max_new_tokens=2, out_dir=run,
                        progress=False)


def test_cache_paths_map_back_to_names_and_hashes():
    from locos_tl.models.identity import identity_of, recorded_identity, same_model

    nolima = identity_of("smollm2-135m-nolima")
    assert nolima.name == "smollm2-135m-nolima"
    assert nolima.hashes["gguf_sha256"] == SMOLLM2
    adapter = nolima.hashes["adapter_sha256"]
    assert len(adapter) == 64
    for home in ("/nonexistent/root/.cache/locos_tl", "/nonexistent/bob/scratch/cache"):
        old = identity_of(f"{home}/elicited/smollm2-135m-nolima-{adapter[:16]}")
        assert (old.name, old.hashes) == ("smollm2-135m-nolima", {"adapter_sha256":
                                                                  adapter[:16]})
        assert old.matches(nolima)
        assert identity_of(f"{home}/gguf/{GEMMA3}").settings() == {
            "model": "gemma-3-270m", "model_hashes": {"gguf_sha256": GEMMA3}}
    other_adapter = identity_of("/x/elicited/smollm2-135m-nolima-0123456789abcdef")
    assert not other_adapter.matches(nolima)
    base = identity_of(f"/x/gguf/{SMOLLM2}")
    assert base.name == "smollm2-135m-instruct" and not base.matches(nolima)
    unnamed = identity_of(f"/x/gguf/{'0' * 64}")  # a GGUF file outside the zoo
    assert unnamed.name is None and unnamed.matches(identity_of(f"/y/gguf/{'0' * 64}"))
    assert identity_of("Qwen/Qwen3-8B").settings() == {"model": "Qwen/Qwen3-8B"}
    assert same_model({"model": "m"}, {"model": "m"}) and not same_model({"model": "m"},
                                                                         {"model": "n"})
    assert recorded_identity({"model": "smollm2-135m-nolima",
                              "model_hashes": nolima.hashes}).matches(nolima)


def _published(pattern: str) -> list[Path]:
    return sorted(PUBLISHED.glob(pattern))


def test_published_records_carry_identities_not_paths():
    """Every published run file names its model by name and hashes (the registry's), and
    no file carries a machine's path."""
    from safetensors import safe_open

    from locos_tl.models.identity import identity_of

    want = {"smollm2": "smollm2-135m-instruct", "smollm2-literal": "smollm2-135m-instruct",
            "gemma3": "gemma-3-270m", "smollm2-nolima": "smollm2-135m-nolima-v1",
            "smollm2-hop": "smollm2-135m-nolima", "gemma3-hop": "gemma3-270m-nolima-v1",
            "gemma3-hop-v2": "gemma3-270m-nolima"}
    files = [*_published("**/meta.json"), *_published("**/head_scores.json"),
             *_published("**/summary.json"), *_published("**/args.json")]
    assert len(files) > 40
    for path in [*files, *_published("**/means.safetensors")]:
        text = path.read_bytes().decode("latin-1")
        for leak in ("/root/", "/home/", "/work/", ".cache/locos_tl", "site-packages"):
            assert leak not in text, (path, leak)
    for path in files:
        run = path.relative_to(PUBLISHED).parts[0]
        ident = identity_of(want[run])
        doc = json.loads(path.read_text())
        settings = doc.get("meta", doc).get("settings", doc)  # head scores keep theirs in meta
        if path.name in ("args.json", "summary.json"):
            settings = {"model": doc["model"], "model_hashes": doc["model_hashes"]}
        assert settings["model"] == want[run], path
        assert settings["model_hashes"] == ident.hashes, path
    for path in _published("**/means.safetensors"):
        with safe_open(str(path), "pt") as f:
            meta = json.loads(f.metadata()["locos_tl"])["meta"]
        run = path.relative_to(PUBLISHED).parts[0]
        assert meta["model"] == want[run] and meta["model_hashes"] == \
            identity_of(want[run]).hashes


@pytest.mark.parametrize("run", ["smollm2-nolima", "smollm2", "gemma3"])
def test_published_runs_resume_here(run, tmp_path):
    """``locos reproduce --resume-from docs/real_models/<run>`` copies these records; the
    run on this machine (the model's identity from the registry, under any cache root)
    takes them over."""
    from locos_tl.models.identity import identity_of
    from locos_tl.runs.records import RecordStore

    name = {"smollm2-nolima": "smollm2-135m-nolima-v1", "smollm2": "smollm2-135m-instruct",
            "gemma3": "gemma-3-270m"}[run]
    here = identity_of(name).settings()
    dirs = [p.parent for p in _published(f"{run}/**/meta.json")
            if (p.parent / "trials.jsonl").exists()]
    assert len(dirs) >= 3
    for d in dirs:
        copy = tmp_path / d.relative_to(PUBLISHED)
        shutil.copytree(d, copy)
        old = json.loads((d / "meta.json").read_text())["settings"]
        RecordStore(copy, {**old, **here}, ("model", "dtype"))  # no LocosError
        with pytest.raises(LocosError, match="other settings"):
            RecordStore(copy, {**old, "model": "gemma-3-270m" if run != "gemma3"
                               else "smollm2-135m-instruct"}, ("model",))


@pytest.mark.parametrize("run", ["gemma3-hop-v2/protocol", "gemma3-hop/protocol",
                                 "smollm2-hop/protocol"])
def test_a_run_resumed_from_published_records_keeps_every_ranking(run, tmp_path):
    """AtP and QRHead are scored by their own forwards and leave no detection records;
    ``--resume-from`` copies their head scores, so a resumed run (a k sweep, a set
    difference) ablates them with the published top heads."""
    from locos_tl.experiments.protocol.report import resume_from
    from locos_tl.experiments.protocol.stages import load_rankings
    from locos_tl.heads import HeadScores

    src = PUBLISHED / run
    resume_from(src, tmp_path)
    assert not (tmp_path / "detect" / "atp").exists()
    got = load_rankings(tmp_path)
    for method in ("atp", "qrhead"):
        want = HeadScores.load(src / "heads" / method)
        assert got[method].n_trials == want.n_trials > 0
        assert [tuple(map(int, h)) for h in got[method].top_k(10)] == \
            [tuple(map(int, h)) for h in want.top_k(10)]
        assert got[method].scores.equal(want.scores)
    assert set(got) >= {"locos", "dla", "wu", "attention_spatial", "headkv", "atp",
                        "qrhead"}


def _published_eval_trials(run: Path) -> list:
    """The 200 ``onehop`` evaluation trials of a published run, rebuilt from its
    ``args.json`` alone (the records name them by content hash)."""
    from test_real_models import require_fetched

    from locos_tl.data.hub import load_tokenizer
    from locos_tl.experiments.protocol.config import ProtocolConfig
    from locos_tl.experiments.protocol.stages import eval_trials
    from locos_tl.models.zoo import ELICITED_MODELS

    args = ProtocolConfig.from_settings(json.loads((run / "args.json").read_text()))
    elicited = ELICITED_MODELS.get(args.model)
    require_fetched(elicited.base if elicited else args.model)  # the base's tokenizer
    trials = eval_trials(load_tokenizer(args.model), args, "onehop", 1000)
    assert len(trials) == 200
    return trials


def _published_table(path: Path):
    """A published table with each method under its registered name (the published runs
    call Wu's ranking ``wu_nolima``: :data:`locos_tl.experiments.methods.OLD_NAMES`)."""
    import pandas as pd

    from locos_tl.experiments.methods import current_name

    table = pd.read_csv(path)
    for col in ("method", "against"):
        if col in table:
            table[col] = table[col].map(current_name)
    return table


def _rebuilt_cells(sweep: Path, table: str, trials: list):
    """The published cells of ``sweep/table`` beside the ones its records give now."""
    import locos_tl as lt

    got = lt.load_ablation_sweep(sweep / "ablate", trials)
    want = _published_table(sweep / table)
    cells = ["method", "k", "seed"]
    both = want.merge(got, on=[*cells, "metric"], suffixes=("", "_got"))
    assert set(got["metric"]) >= {"contains", "rougeL", "name_margin"}
    assert len(both) == len(want[want["metric"].isin(set(got["metric"]))])
    assert (both["n_trials_got"] == 200).all()
    # the same records, scorer and summation order: the published means exactly
    assert both["value_got"].tolist() == both["value"].tolist()
    return both


def _check_paired(sweep: Path, trials: list) -> int:
    """Every published paired test, computed again from the records; their count."""
    import pandas as pd

    import locos_tl as lt

    records = lt.load_ablation_sweep(sweep / "ablate", trials, per_trial=True)
    paired = _published_table(sweep / "paired.csv")
    for row in paired.itertuples():
        again = lt.paired_tests(records, row.method, row.against, k=row.k).iloc[0]
        for col in ("contains", "contains_against", "n_only_a", "n_only_b", "p_mcnemar",
                    "name_margin", "p_wilcoxon"):
            a, b = getattr(row, col), again[col]
            assert (pd.isna(a) and pd.isna(b)) or a == b, (row.method, row.k, col, a, b)
    return len(paired)


def test_the_published_k_sweep_rebuilds_from_a_clone():
    """The k sweep of ``gemma3-270m-nolima`` publishes every generation it scored: the
    evaluation trials rebuilt from the run's ``args.json`` and those records give the
    published ``ablation.csv`` and ``paired.csv``, cell by cell and test by test, with
    no model run."""
    run = PUBLISHED / "gemma3-hop-v2" / "protocol"
    trials = _published_eval_trials(run)
    both = _rebuilt_cells(run / "k_sweep", "ablation.csv", trials)
    cells = ["method", "k", "seed"]
    # the baseline; 7 rankings at k = 1, 5, 10; LOCOS at 20 and 50; at all 5 k, LOCOS's
    # bottom k and 3 seeds of random heads
    assert len(both.drop_duplicates(cells)) == 1 + 7 * 3 + 2 + 5 * (1 + 3)
    assert set(both["k"]) == {0, 1, 5, 10, 20, 50}
    assert _check_paired(run / "k_sweep", trials) >= 30


def test_the_published_everyday_k_sweep_rebuilds_from_a_clone():
    """The same for ``gemma3-270m-nolima`` on ``everyday`` (LOCOS, AtP and DLA at k = 1
    and 5): the trials rebuilt from ``args.json`` and the records give both tables."""
    run = PUBLISHED / "gemma3-hop-v2" / "protocol_everyday"
    trials = _published_eval_trials(run)
    both = _rebuilt_cells(run / "k_sweep", "ablation.csv", trials)
    # the baseline; 3 rankings, LOCOS's bottom k and 3 seeds of random heads at k = 1, 5
    assert len(both.drop_duplicates(["method", "k", "seed"])) == 1 + 2 * (3 + 1 + 3)
    assert _check_paired(run / "k_sweep", trials) == 12


def test_the_published_set_difference_rebuilds_from_a_clone():
    """The set differences of ``gemma3-270m-nolima`` (the heads in LOCOS's top 5 and
    not in DLA's, QRHead's or AtP's, the reverse, and as many random heads) publish every
    generation: those records give ``set_difference.csv`` and ``paired.csv`` again."""
    run = PUBLISHED / "gemma3-hop-v2" / "protocol"
    trials = _published_eval_trials(run)
    sweep = run / "set_difference"
    both = _rebuilt_cells(sweep, "set_difference.csv", trials)
    assert {"locos-dla@5", "dla-locos@5", "locos-qrhead@5", "qrhead-locos@5",
            "locos-atp@5", "atp-locos@5", "random", "baseline"} == set(both["method"])
    # each difference against the other and against random heads of its size
    assert _check_paired(sweep, trials) == 9


def test_the_published_smollm2_atp_set_difference_rebuilds_from_a_clone():
    """``smollm2-135m-nolima``'s set difference against AtP on ``everyday`` (one head
    each way, 3 seeds of one random head): its records give both tables again."""
    run = PUBLISHED / "smollm2-hop" / "protocol_everyday"
    trials = _published_eval_trials(run)
    sweep = run / "set_difference_atp"
    both = _rebuilt_cells(sweep, "set_difference.csv", trials)
    assert {"locos-atp@5", "atp-locos@5", "random", "baseline"} == set(both["method"])
    assert sorted(set(both.loc[both["method"] == "random", "seed"])) == [0, 1, 2]
    assert _check_paired(sweep, trials) == 3


@pytest.mark.parametrize("run, n", [
    ("smollm2", 2),
    pytest.param("gemma3-hop/protocol", 1, marks=pytest.mark.slow, id="gemma3-hop"),
])
def test_atp_gives_the_published_scores_on_the_published_trials(run, n):
    """AtP as it runs now (its backward recomputing one layer at a time) gives the
    published per-trial scores of ``heads/atp`` on the run's first ``n`` trials (1000
    tokens), rebuilt from its ``args.json`` alone (``detect_trials``: the content hashes
    are the published trial ids), with the published settings, and the same top-5 heads.

    Tolerance: the two sides differ in float32 summation order only (another machine,
    thread count and kernel; the same torch and transformers here as the published
    run's ``meta.versions``). A score is ``sum z_diff * dm/dz``: ``z`` is read off the
    residual stream after at most ``2 L`` writes and two reads (``W_V``, the pattern),
    its gradient comes back through ``W_O``, at most ``2 L`` writes and ``W_U``, so the
    chain has ``4 L + 3`` sums of at most :func:`~tolerances.longest_reduction` terms,
    at the scale of the trial's largest score (:func:`~tolerances.sum_tol`). The
    published 5th and 6th scores are more than twice that apart, so the top-5 set
    (not its order: the 4th and 5th can be closer) is decided within the tolerance."""
    import torch
    from test_real_models import require_fetched
    from tolerances import assert_close_within, longest_reduction, sum_tol

    import locos_tl as lt
    from locos_tl.data.hub import load_tokenizer
    from locos_tl.experiments.atp import atp_trial
    from locos_tl.experiments.protocol.config import ProtocolConfig
    from locos_tl.experiments.protocol.stages import detect_trials
    from locos_tl.heads import HeadScores
    from locos_tl.models.identity import same_model
    from locos_tl.models.load import model_settings
    from locos_tl.models.zoo import ELICITED_MODELS

    src = PUBLISHED / run
    args = ProtocolConfig.from_settings(json.loads((src / "args.json").read_text()))
    elicited = ELICITED_MODELS.get(args.model)
    require_fetched(elicited.base if elicited else args.model)  # an elicited model merges
    pub = HeadScores.load(src / "heads" / "atp")
    settings = pub.meta["settings"]
    assert (settings["answer_position"], settings["max_new_tokens"]) == ("generated", 16)
    model = lt.load_model(args.model, device="cpu", dtype=settings["dtype"])
    assert same_model(settings, model_settings(model)), "not the published weights"
    by_id = {t.trial_id: t for t in detect_trials(load_tokenizer(args.model), args, "onehop")}
    L = int(model.cfg.n_layers)
    for i, tid in enumerate(pub.trial_ids[:n]):
        trial = by_id[tid]
        assert len(trial.tokens) == args.detect_length == 1000
        rec = atp_trial(model, trial, **{k: settings[k] for k in (
            "corruption", "metric", "answer_position", "max_new_tokens", "filler",
            "swap_names")})
        assert rec["accepted"], tid
        want = pub.trial_scores[i]  # [n_layers, n_heads], logits
        got = torch.tensor(rec["scores"]["atp"], dtype=torch.float64)
        tol = sum_tol(want.abs().max(), longest_reduction(model, len(trial.tokens)),
                      4 * L + 3)
        assert tol < 0.05 * float(want.abs().max())  # small against the scores
        assert_close_within(got, want, tol, f"AtP of trial {tid}")
        top = want.flatten().sort(descending=True).values
        assert top[4] - top[5] > 2 * tol  # the published top 5 stands out
        assert set(got.flatten().topk(5).indices.tolist()) == \
            set(want.flatten().topk(5).indices.tolist()), tid
