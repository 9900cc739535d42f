"""The protocol's stages before the report: trials, detection, calibration, the ablation
grid (:mod:`locos_tl.experiments.protocol`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from locos_tl.experiments.protocol import common as util
from locos_tl.experiments.protocol.common import (
    DETECT_DEPTHS,
    DETECT_SEED,
    DETECTORS,
    EVAL_DEPTHS,
    EVAL_SEED,
    OWN_PASS,
    WU_NIAH,
    _baseline_only,
    _ints,
    _names,
    _questions,
    rankings_for_ablation,
)
from locos_tl.experiments.protocol.config import ProtocolConfig

#: the evaluation haystack (shipped books): every evaluation trial is read on *Mohicans*
EVAL_BOOKS = ("mohicans_part1.txt", "mohicans_part2.txt")


def build_trials(model: Any, config: ProtocolConfig, out: Path) -> None:
    from locos_tl.data import (
        build_arithmetic_trials,
        build_niah_trials,
        build_parametric_trials,
        load_haystacks,
        load_niah_probes,
    )
    from locos_tl.data.hub import load_tokenizer
    from locos_tl.data.nolima import prompt_form
    from locos_tl.data.packaged import resolve_data_dir
    from locos_tl.data.prompt import PromptBuilder

    tok = load_tokenizer(config.model)  # the checkpoint's own tokenizer, as the CLI builds
    books, niah_file = resolve_data_dir(config.data_dir)  # None: the packaged copies
    detect_hay = load_haystacks([_detect_haystack(config, books)])
    eval_hay = load_haystacks([books / name for name in EVAL_BOOKS])
    chat = prompt_form(config.template)["chat_template"]  # chat models; base: completion
    builder = PromptBuilder(tok)
    for qtype in ("onehop", "direct"):
        det = detect_trials(tok, config, qtype, hay=detect_hay, builder=builder)
        util._save(det, out / "trials" / f"detect_{qtype}.jsonl")
        for length in _ints(config.eval_lengths):
            ev = eval_trials(tok, config, qtype, length, hay=eval_hay, builder=builder)
            util._save(ev, out / "trials" / f"eval_{qtype}_{length}.jsonl")
    probes = load_niah_probes(niah_file)
    niah = build_niah_trials(tok, probes, detect_hay, lengths=[config.detect_length],
                             depths=DETECT_DEPTHS, num_examples=config.n_niah,
                             chat_template=chat, seed=DETECT_SEED, builder=builder)
    util._save(niah, out / "trials" / "detect_niah.jsonl")
    n_ctx = int(model.cfg.n_ctx)
    par = build_parametric_trials(tok, n=config.n_control, seed=EVAL_SEED,
                                  chat_template=chat, n_ctx=n_ctx)
    ari = build_arithmetic_trials(tok, n=config.n_control, seed=EVAL_SEED,
                                  chat_template=chat, n_ctx=n_ctx)
    util._save(par, out / "trials" / "control_parametric.jsonl")
    util._save(ari, out / "trials" / "control_arithmetic.jsonl")
    # calibration text: raw book text from the evaluation books (no template, no BOS)
    text = " ".join(h.text for h in eval_hay)
    step = max(1, len(text) // config.n_calibration)
    prompts = [text[i * step:i * step + config.calibration_chars]
               for i in range(config.n_calibration)]
    cal = out / "trials" / "calibration.json"
    if cal.exists() and json.loads(cal.read_text()) != prompts:
        (out / "means.safetensors").unlink(missing_ok=True)  # other prompts: recalibrate
    cal.write_text(json.dumps(prompts))


def detect_trials(tok: Any, config: ProtocolConfig, qtype: str, *,
                  hay: list | None = None, builder: Any = None) -> list:
    """The detection trials of ``qtype``, ``trials/detect_{qtype}.jsonl`` of the
    ``trials`` stage: ``--n-detect`` NoLiMa trials of ``--detect-needle-set`` at
    ``--detect-length`` tokens on ``--detect-haystack`` (``--distractors`` other needles,
    ``--template``'s form). Deterministic (fixed seed), so a clone rebuilds the trials
    a published run scored (AtP, QRHead, CRI), content hashes included, from its
    ``args.json`` alone.

    Args:
        tok: the model's tokenizer (:func:`locos_tl.data.hub.load_tokenizer`).
        config: the run's options (``locos reproduce``'s, or
            :meth:`ProtocolConfig.from_settings` of its ``args.json``).
        qtype: ``"onehop"`` or ``"direct"``.
        hay: the detection haystack, when already loaded.
        builder: a :class:`~locos_tl.data.prompt.PromptBuilder` of ``tok`` to reuse.

    Returns:
        The :class:`~locos_tl.trials.Trial` list.
    """
    from locos_tl.data import (
        build_nolima_trials,
        expand_needle_set,
        load_haystacks,
        load_needle_set,
    )
    from locos_tl.data.nolima import prompt_form
    from locos_tl.data.packaged import resolve_data_dir
    from locos_tl.data.prompt import PromptBuilder

    if hay is None:
        books, _ = resolve_data_dir(config.data_dir)
        hay = load_haystacks([_detect_haystack(config, books)])
    form = prompt_form(config.template)
    items = expand_needle_set(load_needle_set(needle_sets(config)[0]), [qtype])
    return build_nolima_trials(
        tok, [_names(i, 0) for i in items], hay, lengths=[config.detect_length],
        depths=DETECT_DEPTHS, num_examples=config.n_detect,
        chat_template=form["chat_template"], seed=DETECT_SEED,
        builder=builder or PromptBuilder(tok), template=form["template"],
        distractors=config.distractors)


def eval_trials(tok: Any, config: ProtocolConfig, qtype: str, length: int, *,
                hay: list | None = None, builder: Any = None) -> list:
    """The evaluation trials of one cell, ``trials/eval_{qtype}_{length}.jsonl`` of the
    ``trials`` stage: ``--n-eval`` NoLiMa trials of ``--eval-needle-set`` on *Mohicans*
    (``--distractors`` other needles, ``--template``'s form). Deterministic (fixed seed),
    so a clone rebuilds the trials of a published run, content hashes included, from the
    run's ``args.json`` alone.

    Args:
        tok: the model's tokenizer (:func:`locos_tl.data.hub.load_tokenizer`).
        config: the run's options (``locos reproduce``'s, or
            :meth:`ProtocolConfig.from_settings` of its ``args.json``).
        qtype: ``"onehop"`` or ``"direct"``.
        length: context length in tokens.
        hay: the evaluation haystacks, when already loaded.
        builder: a :class:`~locos_tl.data.prompt.PromptBuilder` of ``tok`` to reuse.

    Returns:
        The :class:`~locos_tl.trials.Trial` list.
    """
    from locos_tl.data import (
        build_nolima_trials,
        expand_needle_set,
        load_haystacks,
        load_needle_set,
    )
    from locos_tl.data.nolima import prompt_form
    from locos_tl.data.packaged import resolve_data_dir
    from locos_tl.data.prompt import PromptBuilder

    if hay is None:
        books, _ = resolve_data_dir(config.data_dir)
        hay = load_haystacks([books / name for name in EVAL_BOOKS])
    form = prompt_form(config.template)
    items = expand_needle_set(load_needle_set(needle_sets(config)[1]), [qtype])
    return build_nolima_trials(
        tok, [_names(i, 1) for i in items], hay, lengths=[length], depths=EVAL_DEPTHS,
        num_examples=config.n_eval, chat_template=form["chat_template"], seed=EVAL_SEED,
        builder=builder or PromptBuilder(tok), template=form["template"],
        distractors=config.distractors)


#: the options the trial files depend on (a change rebuilds them). The NoLiMa samples
#: nest, so a larger ``--n-eval`` keeps every finished generation of the smaller one, and
#: a larger ``--n-cri`` every patched trial; other changes (``--n-detect``, ``--n-niah``,
#: ``--n-control``: the parametric sample does not nest) are refused by the stage's run
#: directory: use a new ``--out``
TRIAL_OPTIONS = ("model", "needle_set", "template", "data_dir", "detect_length",
                 "detect_haystack",
                 "n_detect", "n_eval", "n_niah", "n_control", "eval_lengths",
                 "n_calibration", "calibration_chars")


def needle_sets(config: ProtocolConfig) -> tuple[str, str]:
    """(detection, evaluation) needle sets: ``--detect-needle-set`` and
    ``--eval-needle-set``, each ``--needle-set`` when not given."""
    return (config.detect_needle_set or config.needle_set,
            config.eval_needle_set or config.needle_set)


def _trial_sizes(config: ProtocolConfig) -> dict[str, Any]:
    sizes = {k: getattr(config, k) for k in TRIAL_OPTIONS}
    if config.distractors:  # recorded only when used: older runs stay valid
        sizes["distractors"] = config.distractors
    # a detection or evaluation set of its own is recorded only when it differs from
    # --needle-set: runs (and published sizes) from before the options stay valid
    for key, value in zip(("detect_needle_set", "eval_needle_set"), needle_sets(config),
                          strict=True):
        if value != config.needle_set:
            sizes[key] = value
    return sizes


def _trials_changed(out: Path, config: ProtocolConfig) -> bool:
    """True when the trial files are missing or were built with other options."""
    done = out / "stages" / "trials.done"
    if not done.exists():
        return True
    old = json.loads(done.read_text()).get("sizes")
    if old is None:  # a run from before sizes were recorded: rebuild (deterministic)
        return True
    new = _trial_sizes(config)
    if old != new:
        changed = {k: (old.get(k), v) for k, v in new.items() if old.get(k) != v}
        print(f"trials: rebuilt for changed options {changed}")  # noqa: T201
        return True
    return False


def _detect_haystack(config: ProtocolConfig, books: Path) -> Path:
    """``--detect-haystack``: ``dracula`` (a shipped book), ``prose`` (the self-written
    haystack shipped with locos_tl, no named people) or a file."""
    if config.detect_haystack == "dracula":
        return books / "dracula_part1.txt"
    if config.detect_haystack == "prose":
        from locos_tl.data.haystack import PROSE_HAYSTACK

        return PROSE_HAYSTACK
    return Path(config.detect_haystack)


def detect(model: Any, config: ProtocolConfig, out: Path) -> dict[str, Any]:
    from locos_tl.experiments.score import score_methods

    trials = util._load(out / "trials" / "detect_onehop.jsonl")
    res = score_methods(model, trials, methods=list(DETECTORS), out_dir=out / "detect",
                        max_new_tokens=config.max_new_tokens, batch_size=config.batch_size)
    niah = util._load(out / "trials" / "detect_niah.jsonl")
    wu_niah = score_methods(model, niah, methods=["wu"], out_dir=out / "detect_niah",
                            max_new_tokens=config.niah_max_new_tokens,
                            batch_size=config.batch_size)
    res = dict(res)
    res[WU_NIAH] = wu_niah["wu"]
    extra = forward_methods(config.methods)
    if extra:  # AtP, QRHead: their own forwards, records in detect/<method>/
        res.update(score_methods(model, trials, methods=extra, out_dir=out / "detect",
                                 max_new_tokens=config.max_new_tokens))
    return res


def forward_methods(methods: str) -> list[str]:
    """The methods of ``--methods`` with their own forward passes (:data:`OWN_PASS`:
    ``atp``, ``qrhead``), scored only when asked for."""
    return [m for m in util._methods(methods) if m in OWN_PASS]


def load_rankings(out: Path) -> dict[str, Any]:
    """Every ranking of a run: the decode-pass detectors from their records in
    ``detect/``, Wu on NIAH from ``detect_niah/``, and AtP and QRHead (scored only when
    ``--methods`` named them) from ``detect/<method>/``, else from the report's copy in
    ``heads/<method>/`` (what a published run holds)."""
    from locos_tl.runs.rundir import load_head_scores

    res = {m: load_head_scores(out / "detect", m) for m in DETECTORS}
    res[WU_NIAH] = load_head_scores(out / "detect_niah", "wu")
    for m in OWN_PASS:
        found = [d for d in (out / "detect" / m, out / "heads" / m)
                 if (d / "head_scores.json").exists()]
        if found:
            res[m] = load_head_scores(found[0])
    return res


def calibrate(model: Any, config: ProtocolConfig, out: Path) -> Any:
    from locos_tl.engine.ablation import AblationMeans, calibrate_means

    path = out / "means.safetensors"
    if path.exists():
        return AblationMeans.load(path)
    prompts = json.loads((out / "trials" / "calibration.json").read_text())
    means = calibrate_means(model, prompts, max_tokens=config.calibration_tokens,
                            progress=True)
    means.save(path)
    return means


#: Ray runs its worker processes at nice 15, so any other process on the machine takes
#: their CPU; the sweep's workers do all of its work, so they run at the default 0
RAY_NICE_0 = {"runtime_env": {"env_vars": {"RAY_worker_niceness": "0"}}}


def ablate(model: Any, config: ProtocolConfig, out: Path, scores: dict[str, Any],
           means: Any) -> None:
    from locos_tl.experiments.evaluate import ablation_sweep
    from locos_tl.runs.distributed.workers import RayWorkers

    head_sets = rankings_for_ablation(scores, config.methods)
    ks = _ints(config.ks)
    common = dict(k=ks, mode="query_mean", means=means, seeds=_ints(config.random_seeds),
                  bottom="locos", max_new_tokens=config.eval_max_new_tokens,
                  workers=config.workers, extend=True)  # --n-eval may grow (nested)
    if config.workers > 1:  # Ray starts workers at nice 15: a sweep owns the machine
        common["workers"] = RayWorkers(config.workers, ray_init_kwargs=RAY_NICE_0)
    if _baseline_only(config.methods) or not head_sets:  # nothing ranked: baseline only
        common.update(random=False, bottom=None)
    elif "locos" not in head_sets:  # LOCOS accepted no trial: no bottom-k control
        common.update(bottom=None)
    for length in _ints(config.eval_lengths):
        for qtype in _questions(config):
            trials = util._load(out / "trials" / f"eval_{qtype}_{length}.jsonl")
            ablation_sweep(model, trials, head_sets, scorer="nolima",
                           out_dir=out / "ablate" / f"{qtype}_{length}", **common)
    # the controls may run a subset of the (k, seed) grid (``--control-ks``,
    # ``--control-seeds``): DS(k) is reported where both sides exist
    control = {**common, "max_new_tokens": 16,
               "k": _ints(config.control_ks or config.ks),
               "seeds": _ints(config.control_seeds or config.random_seeds)}
    for name in ("parametric", "arithmetic"):
        trials = util._load(out / "trials" / f"control_{name}.jsonl")
        ablation_sweep(model, trials, head_sets, scorer="control",
                       out_dir=out / "ablate" / f"control_{name}", **control)


def job_keys(config: ProtocolConfig, scores: dict[str, Any], L: int, H: int,
             control: bool = False) -> dict[tuple[str, int, int], str]:
    """(method, k, seed) -> head-set key, from the same jobs :func:`ablate` ran (with
    ``control``: the control runs' grid, ``--control-ks`` and ``--control-seeds``)."""
    from locos_tl.experiments.ablation_plan import build_jobs

    ks, seeds = config.ks, config.random_seeds
    if control:
        ks, seeds = config.control_ks or ks, config.control_seeds or seeds
    sets = rankings_for_ablation(scores, config.methods)
    only = _baseline_only(config.methods) or not sets
    jobs = build_jobs(sets, _ints(ks), n_layers=L, n_heads=H, seeds=_ints(seeds),
                      random=not only, bottom="locos" if "locos" in sets else None)
    return {(j.method, j.k, j.seed): j.key for j in jobs}
