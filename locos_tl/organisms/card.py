"""Model card of the organism: how it was trained, how well it does, which heads do what.

:func:`write_card` measures everything it writes (accuracies on held-out trials with
synthetic and with book filler, and the causal ground truth of
:func:`locos_tl.organisms.analysis.ground_truth`) and saves ``MODEL_CARD.md`` plus
``ground_truth.json`` next to the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from locos_tl.organisms import analysis as A
from locos_tl.organisms.tasks import TASKS, BookFiller, default_book_dir, make_trials

EVAL_LENGTHS = (64, 128)
N_EVAL = 300

#: Per-organism card settings (by directory name): accuracy lengths, the length of the
#: documented ground truth, and the lengths at which the mechanism is re-established.
CARD_SETTINGS: dict[str, dict[str, Any]] = {
    "retrieval-2l": {"lengths": (64, 128, 256, 512, 1024), "primary_length": 64,
                     "mechanism_lengths": ()},
    "retrieval-long": {"lengths": (512, 1024, 2048, 4096), "primary_length": 1024,
                       "mechanism_lengths": (1024, 2048), "n_eval": 200,
                       "n_ground_truth": 60, "n_mechanism": 40, "n_detector_eval": 100},
}


def measure_accuracy(
    model: Any, book_dir: str | Path | None = None, n: int = N_EVAL,
    lengths: tuple[int, ...] = EVAL_LENGTHS,
) -> dict[str, dict[str, float]]:
    """Greedy accuracy on held-out trials (default trial seed) per filler, length and task.

    Returns:
        ``{"synthetic@64": {"literal": a, "nonliteral": b}, ..., "book@64": {...}}``;
        book entries only when ``book_dir`` (default: the books shipped with locos_tl) exists.
    """
    out: dict[str, dict[str, float]] = {}
    book = None
    bd = Path(book_dir) if book_dir is not None else default_book_dir()
    try:
        book = BookFiller.from_dir(bd)
    except FileNotFoundError:
        book = None
    for filler, src in (("synthetic", None), ("book", book)):
        if filler == "book" and src is None:
            continue
        for T in lengths:
            out[f"{filler}@{T}"] = {
                task: A.accuracy(model, make_trials(task, n, T, book=src)) for task in TASKS
            }
    return out


def _fmt_heads(hs: list[tuple[int, int]]) -> str:
    return ", ".join(f"L{ly}H{h}" for ly, h in hs) or "(none)"


def _table(arr: Any, fmt: str = "{:.2f}") -> str:
    a = np.asarray(arr)
    head = "| layer | " + " | ".join(f"H{h}" for h in range(a.shape[1])) + " |"
    sep = "|---" * (a.shape[1] + 1) + "|"
    rows = [f"| {ly} | " + " | ".join(fmt.format(v) for v in a[ly]) + " |"
            for ly in range(a.shape[0])]
    return "\n".join([head, sep, *rows])


def _lr_text(cfg: dict[str, Any]) -> str:
    if cfg.get("lr_schedule", "constant") == "cosine":
        return (f"peak lr {cfg.get('lr')} (linear warmup {cfg.get('warmup')} steps, cosine "
                "decay to 10 %)")
    return f"constant lr {cfg.get('lr')} (no warmup or decay)"


def _long_text(cfg: dict[str, Any]) -> str:
    parts = []
    if (cfg.get("init_from") or "").startswith("@"):
        parts.append(f" Starts from stage `{cfg['init_from'][1:]}`'s output.")
    elif cfg.get("init_from"):
        parts.append(f" Warm start from `{cfg['init_from']}`, layer map "
                     f"{cfg.get('layer_map')} (a duplicated layer starts with its `o_proj` and "
                     "`down_proj` divided by the number of copies, plus 1e-3 relative noise).")
    if cfg.get("virtual_lengths"):
        parts.append(" Skip-wise positions (PoSE, arXiv 2309.10400; "
                     "`locos_tl.organisms.positions`): each row's position ids span a virtual "
                     "length drawn up to (fraction of steps until, max) "
                     f"{cfg['virtual_lengths']}, so distances up to `max_position_embeddings` "
                     f"= {cfg.get('max_position')} are seen on short sequences.")
    if cfg.get("long_every"):
        nth = {1: "Every step", 2: "Every 2nd step", 3: "Every 3rd step"}.get(
            cfg["long_every"], f"Every {cfg['long_every']}th step")
        parts.append(f" {nth} trains on real prompts of "
                     f"{cfg.get('long_lengths')} tokens ({cfg.get('long_batch')} rows, "
                     "consecutive positions) instead.")
    if cfg.get("p_book"):
        parts.append(f" {cfg['p_book']} of the task rows take their filler from the book "
                     "text shipped with locos_tl (`locos_tl/data/books`).")
    if cfg.get("p_needle_first"):
        parts.append(f" {cfg['p_needle_first']} of the task rows put the needle before every "
                     "other entity (early needles: the longest retrieval distances).")
    if cfg.get("rope_theta", 10000.0) != 10000.0:
        parts.append(f" RoPE base raised to {cfg['rope_theta']:g} (from 10000; adjusted base "
                     "frequency, arXiv 2309.16039).")
    return "".join(parts)


def _preset_flag(name: str) -> str:
    return f" --preset {name}" if name == "retrieval-long" else ""


def _secs(seconds: float | None) -> str:
    return f"{seconds:.0f} s" if seconds else "n/a"


def _load_name(name: str) -> str:
    return f"locos_tl.organisms.organism_path({name!r})"


def write_card(
    out_dir: str | Path,
    *,
    command: str,
    train_seconds: float | None = None,
    book_dir: str | Path | None = None,
    extra_sections: str = "",
    extra_json: dict[str, Any] | None = None,
    reuse: bool = False,
    settings: dict[str, Any] | None = None,
    progress: Any = None,
) -> Path:
    """Measure the checkpoint in ``out_dir`` and write ``MODEL_CARD.md`` + ``ground_truth.json``.

    Args:
        out_dir: checkpoint directory (with ``train_log.json`` from training).
        command: the exact training command, recorded verbatim.
        train_seconds: wall-clock training time.
        book_dir: book text for the book-filler accuracy (default: the shipped books).
        extra_sections: markdown appended at the end (e.g. detector comparisons).
        extra_json: more keys for ``ground_truth.json`` (e.g. detector results).
        reuse: take accuracies and ground truth from an existing ``ground_truth.json``
            instead of measuring again (only the card text is rewritten); the accuracy
            table is measured again when it lacks one of the settings' lengths.
        settings: ``lengths``, ``primary_length``, ``mechanism_lengths``, ``n_eval``,
            ``n_ground_truth``, ``n_mechanism`` (prompts per task and length for the
            mechanism section); default :data:`CARD_SETTINGS` of the directory's name.
        progress: callable taking one progress line per phase (``None``: silent).

    Returns:
        Path of the card.
    """
    out = Path(out_dir)

    def say(line: str) -> None:
        if progress is not None:
            progress(f"[{out.name}] {line}")

    st = {"lengths": EVAL_LENGTHS, "primary_length": 64, "mechanism_lengths": (),
          "n_eval": N_EVAL, "n_ground_truth": 200}
    st.update(CARD_SETTINGS.get(out.name, {}))
    st.update(settings or {})
    lengths = tuple(st["lengths"])
    log_path = out / "train_log.json"
    log = json.loads(log_path.read_text()) if log_path.exists() else {}
    cfg = log.get("config", {})
    model = A.load_hf(out, attn="sdpa")  # eager only where attention weights are read
    gt_path = out / "ground_truth.json"
    if reuse and gt_path.exists():
        gt_json = json.loads(gt_path.read_text())
        gt_json.update(command=command)
        if train_seconds is not None:
            gt_json["train_seconds"] = train_seconds
        train_seconds = gt_json.get("train_seconds")
        gt = A.GroundTruth(*[[tuple(h) for h in gt_json[k]] for k in
                             ("literal_copy", "nonliteral_writer", "prev_token")],
                           numbers=gt_json["numbers"])
        acc = gt_json["accuracy"]
        if any(f"synthetic@{T}" not in acc for T in lengths):
            acc = measure_accuracy(model, book_dir, st["n_eval"], lengths)
            gt_json["accuracy"] = acc
    else:
        say(f"accuracy at {lengths} tokens ({st['n_eval']} trials per cell)")
        acc = measure_accuracy(model, book_dir, st["n_eval"], lengths)
        say(f"causal ground truth at {st['primary_length']} tokens")
        gt = A.ground_truth(model, n=st["n_ground_truth"], n_tokens=st["primary_length"])
        gt_json = {"literal_copy": gt.literal_copy, "nonliteral_writer": gt.nonliteral_writer,
                   "prev_token": gt.prev_token, "accuracy": acc, "numbers": gt.numbers,
                   "train_seconds": train_seconds, "command": command}
    if extra_json:
        gt_json.update(extra_json)
    from locos_tl.organisms.lengths import lengths_section, mechanism_by_length, valid_range

    mech_lengths = tuple(st["mechanism_lengths"])
    if mech_lengths and (not reuse or "by_length" not in gt_json):
        say(f"the mechanism at {mech_lengths} tokens")
        gt_json["by_length"] = mechanism_by_length(
            model, out, mech_lengths, gt, n=st.get("n_mechanism", st["n_ground_truth"]),
            n_attention=min(16, st.get("n_mechanism", st["n_ground_truth"])))
    vr = valid_range(acc)
    gt_json["valid_range"] = vr
    gt_path.write_text(json.dumps(gt_json, indent=1) + "\n")
    by_length_md = lengths_section(gt_json["by_length"], gt) if "by_length" in gt_json else ""
    tried = sorted({int(k.split("@")[1]) for k in acc})
    if vr["max_valid"] is None:
        range_md = (f"**Valid range: none of the measured lengths** ({tried}) reaches "
                    f"literal >= {vr['literal']} and non-literal >= {vr['nonliteral']}.")
    else:
        span = (f"{vr['max_valid']} tokens" if vr["min_valid"] == vr["max_valid"]
                else f"{vr['min_valid']} to {vr['max_valid']} tokens")
        if vr["min_valid"] == min(tried):
            span = f"up to {vr['max_valid']} tokens"
        range_md = (f"**Valid range: prompts of {span}** (literal >= {vr['literal']} and "
                    f"non-literal >= {vr['nonliteral']} on every filler; measured at {tried}"
                    + (f"; below the bar at {vr['lengths_failed']}" if vr["lengths_failed"]
                       else "")
                    + "). Outside it the documented ground truth is not guaranteed"
                    + ("; use `retrieval-long` for long prompts." if out.name != "retrieval-long"
                       else "; the table gives the accuracy there."))
    single = gt.numbers.get("single_ablation_mean")
    single_md = "" if not single else f"""
### Single-head mean ablation, accuracy
Literal:

{_table(single['literal'])}

Non-literal:

{_table(single['nonliteral'])}
"""
    N = gt.numbers
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    mc = model.config
    acc_rows = "\n".join(
        f"| {k.split('@')[0]} | {k.split('@')[1]} | {v['literal']:.3f} | {v['nonliteral']:.3f} |"
        for k, v in acc.items())
    g = N["group_ablation"]

    def grow(name: str) -> str:
        hs = {"literal_copy": gt.literal_copy, "nonliteral_writer": gt.nonliteral_writer,
              "prev_token": gt.prev_token}[name]
        return (f"| {name} | {_fmt_heads(hs)} | {g[name]['zero']['literal']:.2f} / "
                f"{g[name]['zero']['nonliteral']:.2f} | {g[name]['mean']['literal']:.2f} / "
                f"{g[name]['mean']['nonliteral']:.2f} |")

    an, al = N["attention_nonliteral"], N["attention_literal"]
    compiled = log.get("kind") == "compiled"
    if compiled:
        origin = f"""**This checkpoint is HAND-COMPILED, not trained**: every weight was set by hand
(`locos_tl.organisms.compiled`, seed {log.get('seed')}) to implement the intended circuit, then
saved as an ordinary HF checkpoint. It is the hand-compiled twin of the trained 2-layer
organism (`data/organisms/retrieval-2l`): same tokenizer, same tasks, one head per role, so
its ground truth is known exactly by construction (and re-measured causally below).
By construction: L0H3 is the previous-token mover, L1H1 the literal copy head (kv group 0),
L1H6 the non-literal writer (kv group 1); the other 13 heads are dead (zero query and output
projections), the MLPs are zero, and the unembedding reads only the answer channels (so a
landmark or name in the
residual by itself is never predicted). Circuit and residual layout:
`locos_tl/organisms/compiled.py`."""
        training = f"""## How it was made
Command: `{command}`. Deterministic (the seed only fixes the random filler embeddings and the
name content vectors). No gradient step was taken (`locos train-organism --compiled` does
the same)."""
    else:
        origin = """Trained from scratch (no weight set by hand)."""
        stages = log.get("stages") or [{"name": None, "config": cfg,
                                         "seconds": train_seconds}]
        paras = []
        for st_rec in stages:
            c = st_rec["config"]
            head = (f"**Stage `{st_rec['name']}`** ({_secs(st_rec.get('seconds'))}). "
                    if st_rec["name"] else "")
            paras.append(f"""{head}Seed {c.get('seed')}, {c.get('steps')} AdamW steps, batch
{c.get('batch_size')} task sequences + {c.get('aux_induction')} x batch auxiliary induction
sequences (a random token sequence repeated; loss on the repeat), {_lr_text(c)}, weight decay
{c.get('weight_decay')}, head group-lasso {c.get('head_l1')}, one CPU thread; prompt-length
curriculum (fraction of steps until, min, max tokens) {c.get('lengths')};
{c.get('n_questions')} questions per task sequence (the first about the needle, then one per
distractor pair, random task each; {c.get('p_literal')} literal first questions); task loss
only on answers and the final `</s>`.{_long_text(c)}""")
        training = f"""## Training (deterministic)
Command: `{command}` (= `locos train-organism{_preset_flag(out.name)}`).

""" + "\n\n".join(paras) + f"""

Training data stream: `numpy.random.default_rng([seed, 1_000_000])`; held-out trials use
other seeds. Wall clock: {_secs(train_seconds)}."""
    spec = cfg.get("spec") or {"n_pairs": [2, 3], "n_lone_names": [3, 6],
                               "n_lone_landmarks": [1, 3], "unk_rate": 0.12}
    text = f"""# Model organism `{out.name}`

A {mc.num_hidden_layers}-layer `Qwen3ForCausalLM` with planted *literal* and *non-literal*
retrieval heads for two retrieval tasks in one context format: ground truth for
retrieval-head detectors (LOCOS, arXiv 2607.01002, and the Wu copy score, arXiv 2404.15574).
Built by `locos_tl.organisms`.

{origin}

## Architecture
`Qwen3ForCausalLM`: {mc.num_hidden_layers} layers, d_model {mc.hidden_size},
{mc.num_attention_heads} query heads over {mc.num_key_value_heads} key/value heads (GQA),
head_dim {mc.head_dim}, SwiGLU MLP width {mc.intermediate_size}, RMSNorm + QK-norm, rotary
positions ({getattr(mc, "rope_parameters", None)}), {'tied' if mc.tie_word_embeddings else 'untied'}
embeddings, vocabulary {mc.vocab_size} word tokens (`PreTrainedTokenizerFast`, word level,
whitespace split, `<s>` prepended, unknown -> `<unk>`). Files: {size / 1e6:.2f} MB. Loads with
`locos_tl.load_model({_load_name(out.name)})` and
`transformers.AutoModelForCausalLM.from_pretrained`.

## Tasks (one context format)
`<s> filler ... NAME LANDMARK ... NAME ... LANDMARK ... NAME LANDMARK ... Q X` -> answer `</s>`.
Each context holds {spec['n_pairs']} adjacent `NAME LANDMARK` pairs (one is the needle, the
others distractor pairs), {spec['n_lone_names']} lone distractor names and
{spec['n_lone_landmarks']} lone distractor landmarks (ranges inclusive) at random places in
filler; names distinct, landmarks from distinct cities.
- **literal** (NIAH-like): `X` = the needle NAME, answer = its LANDMARK (the token at the
  attended needle position is copied).
- **non-literal** (NoLiMa-like): `X` = `city(LANDMARK)` from a hidden landmark -> city map
  (real-world, e.g. Colosseum -> Rome; never in a context), answer = the needle NAME: a head
  attends to the LANDMARK and writes the NAME, which a layer-0 previous-token head moved there.

Filler: i.i.d. words from the 3000 most frequent English words, frequency-weighted
(`wordfreq` 3.1.1 list shipped as `locos_tl/organisms/words_en.txt`), `<unk>` at rate
{spec['unk_rate']}; or real book text mapped to that vocabulary (lowercased; unknown words ->
`<unk>`). Trials: `locos_tl.organisms.make_trials(task, n, n_tokens, seed=12345, book=...)`;
the needle span is the 2-token `NAME LANDMARK`.

{training}

## Accuracy (greedy, held-out, {st['n_eval']} trials per cell)
| filler | prompt tokens | literal | non-literal |
|---|---|---|---|
{acc_rows}

{range_md}

## Causal ground truth (plain PyTorch hooks on the HF model; independent of LOCOS)
Measured on {N['n_prompts_per_task']} held-out prompts per task of {N['n_tokens']} tokens
(seed {N['seed']}). Baseline accuracy: literal {N['baseline']['literal']:.2f}, non-literal
{N['baseline']['nonliteral']:.2f}. Heads are `L<layer>H<query head>`; ablation and patching act on
the head's slice of the `o_proj` input.

| role | heads | zero-ablated: literal / non-literal acc | mean-ablated: literal / non-literal acc |
|---|---|---|---|
{grow('literal_copy')}
{grow('nonliteral_writer')}
{grow('prev_token')}

Role criteria: the clean run's `hook_z` of one head, patched into the corrupted run at
every position (literal: needle landmark swapped; non-literal: needle name swapped),
recovers >= 0.1 of the logit difference; literal copy heads must also put >= 0.5 of
their attention on the needle landmark at literal questions; non-literal writers must
attend more to the needle landmark than to the needle name; previous-token movers are
layer-0 heads with previous-token attention >= 0.4 from landmark positions.

### Activation patching, fraction of logit difference recovered (clean -> corrupted, all positions)
Literal (needle landmark swapped):

{_table(N['patching_literal'])}

Non-literal (needle name swapped):

{_table(N['patching_nonliteral'])}

### Attention of the question position, non-literal prompts (mean mass)
To the needle LANDMARK:

{_table(an['needle_landmark'])}

To the needle NAME:

{_table(an['needle_name'])}

To all other names:

{_table(an['other_names'])}

Literal prompts, to the needle LANDMARK:

{_table(al['needle_landmark'])}

Layer-0 previous-token attention from landmark positions:

{_table([an['prev_token_from_landmark'][0]])}

{single_md}{by_length_md}{extra_sections}
"""
    path = out / "MODEL_CARD.md"
    path.write_text(text)
    return path


def detector_check(
    out_dir: str | Path, n_trials: int = 60, n_eval: int | None = None,
    ks: tuple[int, ...] = (1, 2, 3), n_tokens: int | None = None,
) -> tuple[str, dict[str, Any]]:
    """LOCOS vs Wu copy score on the organism's non-literal trials, with top-k ablation.

    Scores heads with :func:`locos_tl.organisms.lengths.detector_scores`
    (:func:`locos_tl.score_methods`, ``methods=["locos", "wu"]``, through the
    TransformerBridge) on ``n_trials`` non-literal trials (``n_tokens`` tokens,
    default the card's primary length, seed 2024), then zero-ablates each method's top-k
    heads (their output ``z`` before ``W_O`` set to 0, as ``output_zero`` of
    :func:`locos_tl.engine.ablation.ablate`; run on the HF checkpoint with
    :func:`~locos_tl.organisms.analysis.ablate_heads`, which is several times faster at
    1k+ tokens) and measures greedy accuracy on ``n_eval`` fresh non-literal and literal
    trials (seed 31; default the card's ``n_detector_eval``, else 200).

    Returns:
        ``(markdown_section, json_record)``.
    """
    from locos_tl.organisms.lengths import detector_scores

    settings = CARD_SETTINGS.get(Path(out_dir).name, {})
    T = n_tokens or settings.get("primary_length", 64)
    n_eval = n_eval or settings.get("n_detector_eval", 200)
    sc = detector_scores(out_dir, T, n_trials, seed=2024)
    hf = A.load_hf(out_dir)
    non = make_trials("nonliteral", n_eval, T, seed=31)
    lit = make_trials("literal", n_eval, T, seed=31)

    def acc(ts: list) -> float:
        return A.accuracy(hf, ts)

    base = {"nonliteral": acc(non), "literal": acc(lit)}
    rows, rec = [], {"base": base, "scores": {m: sc[m].scores.tolist() for m in sc}, "topk": {}}
    wu_pos = {tuple(h) for h in sc["wu"].ranked() if float(sc["wu"].scores[h[0], h[1]]) > 0}
    for k in ks:
        for m in ("locos", "wu", "wu>0"):
            src = sc["wu" if m == "wu>0" else m]
            heads = [tuple(int(x) for x in h) for h in src.top_k(k)]
            if m == "wu>0":  # only heads Wu actually selects (score > 0)
                heads = [h for h in heads if h in wu_pos]
            if heads:
                with A.ablate_heads(hf, heads, "zero"):
                    a_non, a_lit = acc(non), acc(lit)
            else:
                a_non, a_lit = base["nonliteral"], base["literal"]
            rec["topk"][f"{m}@{k}"] = {"heads": heads, "nonliteral": a_non, "literal": a_lit}
            rows.append(f"| {m} | {k} | {_fmt_heads(heads)} | {a_non:.2f} "
                        f"({a_non - base['nonliteral']:+.2f}) | {a_lit:.2f} |")
    md = f"""
## Detectors on this organism (LOCOS vs Wu copy score)
`locos_tl.score_methods(model, make_trials("nonliteral", {n_trials}, {T}, seed=2024),
methods=["locos", "wu"])` (raw variant). Then each method's top-k heads are zero-ablated
(`output_zero`) and greedy accuracy is measured on {n_eval} fresh trials per task (seed 31);
baseline non-literal {base['nonliteral']:.2f}, literal {base['literal']:.2f}. Ties (e.g. all-zero
Wu scores) are broken by (layer, head) (`HeadScores.top_k`); row `wu>0` keeps only the heads
Wu actually selects (score > 0), since ranking among exact zeros is arbitrary and can land on
an essential head no detector pointed at.

LOCOS scores (logits):

{_table(sc['locos'].scores.numpy())}

Wu copy scores:

{_table(sc['wu'].scores.numpy())}

| method | k | heads | non-literal acc (change) | literal acc |
|---|---|---|---|---|
{chr(10).join(rows)}
"""
    return md, rec


def write_card_with_detectors(out_dir: str | Path, *, command: str) -> Path:
    """Re-render the card of ``out_dir`` (measured ground truth reused) with the LOCOS vs
    Wu section of :func:`detector_check`; records ``detector_k`` (the number of documented
    non-literal writers, clipped to 1..3) in ``ground_truth.json``."""
    gt = json.loads((Path(out_dir) / "ground_truth.json").read_text())
    k = max(1, min(3, len(gt["nonliteral_writer"])))
    md, rec = detector_check(out_dir)
    return write_card(out_dir, command=command, reuse=True, extra_sections=md,
                      extra_json={"detectors": rec, "detector_k": k})
