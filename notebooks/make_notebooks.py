"""Write the example notebooks (outputs stripped) from the cell sources below.

Edit the cells here, then run ``python notebooks/make_notebooks.py``; the ``.ipynb``
files are generated, so the notebooks in git never carry outputs. ``pytest -m notebooks``
executes every ``notebooks/NN_*.ipynb`` (``tests/test_notebooks.py``).

Size: each notebook runs in well under two minutes on a busy 2-core CPU
(``OMP_NUM_THREADS=1``; the test allows five), and every step that takes more than a few
seconds shows a tqdm progress bar. A new notebook is one more ``nbNN()`` function and one
more entry in :data:`NOTEBOOKS`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = '''\
import os
from pathlib import Path

import locos_tl
from locos_tl import plot
from locos_tl.organisms import DEFAULT_ORGANISM, default_book_dir, make_trials

# The default organism, retrieval-long (3 layers x 8 heads, valid on prompts of 512-2048
# tokens). To use another, point LOCOS_ORGANISM at it and set N_TOKENS to its valid range
# (retrieval-2l: 64-128 tokens; each organism's MODEL_CARD.md gives it).
ORGANISM = os.environ.get("LOCOS_ORGANISM", DEFAULT_ORGANISM)
N_TOKENS = 512  # prompt length in tokens
# Public-domain novels beside the repository (../shared/data/haystack) as filler text;
# synthetic filler when they are not there.
BOOKS = default_book_dir()
book = BOOKS if BOOKS.is_dir() else None
print("filler:", BOOKS if book else "synthetic (no book text found)")

model = locos_tl.load_model(ORGANISM, device="cpu")
cfg = model.cfg
print(f"{Path(ORGANISM).name}: {cfg.n_layers} layers x {cfg.n_heads} heads "
      f"({cfg.n_key_value_heads} kv heads), vocabulary {cfg.d_vocab}; prompts of "
      f"{N_TOKENS} tokens")'''

GROUND_TRUTH = '''\
import json

gt_path = Path(ORGANISM) / "ground_truth.json"
gt = json.loads(gt_path.read_text()) if gt_path.exists() else {}
roles = {role: [tuple(h) for h in gt.get(role, [])]
         for role in ("literal_copy", "nonliteral_writer", "prev_token")}
roles'''


def nb00() -> list:
    return [
        new_markdown_cell("""\
# 00 · The model organism: ground truth for retrieval-head detectors

Nobody knows which heads of Qwen3-8B "really" retrieve. The shipped **model organism**
`retrieval-long` is a small Qwen3-architecture checkpoint (3 layers x 8 heads) trained on
two retrieval tasks in one context format, whose mechanism was established causally
(head ablation and activation patching, independently of LOCOS): see `MODEL_CARD.md`
next to the checkpoint. This notebook trains nothing: it loads the organism, shows the
tasks, measures accuracy and draws the LOCOS heatmap."""),
        new_code_cell(SETUP),
        new_code_cell("print((Path(ORGANISM) / 'MODEL_CARD.md').read_text()[:1500])"),
        new_markdown_cell("""\
## The two tasks

The context holds `NAME LANDMARK` pairs (one is the needle), lone distractor names and
lone distractor landmarks in filler text.

- **literal** (NIAH-like): the question gives the needle's NAME, the answer is its
  LANDMARK — the token a retrieval head attends to is the token it outputs.
- **non-literal** (NoLiMa-like): the question gives the landmark's *city* (a hidden map
  that exists only in the training data), the answer is the NAME — a head attends to
  the LANDMARK and writes the NAME, which an earlier layer moved there."""),
        new_code_cell('''\
for task in ("literal", "nonliteral"):
    t = make_trials(task, 1, n_tokens=N_TOKENS, book=book, seed=7)[0]
    words = plot.token_labels(model.tokenizer, t.tokens)
    print(f"{task}: ... {' '.join(words[-20:])}  ->  {t.answer!r}; "
          f"needle {words[slice(*t.needle_span)]}")'''),
        new_markdown_cell("## Accuracy (greedy decoding, held-out trials)"),
        new_code_cell('''\
import pandas as pd
from tqdm.auto import tqdm

rows = []
for task in ("literal", "nonliteral"):
    for n_tokens in (N_TOKENS, 2 * N_TOKENS):
        trials = make_trials(task, 20, n_tokens=n_tokens, book=book, seed=3)
        hits = [locos_tl.greedy_decode(model, t.tokens, max_new_tokens=3).text == t.answer
                for t in tqdm(trials, desc=f"{task}, {n_tokens} tokens")]
        rows.append({"task": task, "tokens": n_tokens, "accuracy": sum(hits) / len(hits)})
pd.DataFrame(rows)'''),
        new_code_cell(GROUND_TRUTH),
        new_markdown_cell("""\
## LOCOS heatmap on the non-literal task

The non-literal writers attend to the landmark and write the name: LOCOS, which scores
what a head writes toward the answer from the needle, ranks them first."""),
        new_code_cell('''\
trials = make_trials("nonliteral", 24, n_tokens=N_TOKENS, book=book, seed=11)
scores = locos_tl.score_trials(model, trials, method="locos", max_new_tokens=4)
print("top-3 LOCOS heads:", scores.top_k(3), "| documented writers:", roles["nonliteral_writer"])
plot.head_heatmap(scores)'''),
    ]


def nb01() -> list:
    return [
        new_markdown_cell("""\
# 01 · Quickstart: score attention heads with LOCOS

LOCOS (Gema, Alex & Minervini 2026, arXiv 2607.01002) scores a head by **what it writes
toward the answer from the needle**:

$$\\phi_{l,h,t,j} = \\alpha_{l,h,t,j}\\, u_{y_t}^\\top (v_{j} W_O^{l,h}), \\qquad
c_t = \\sum_{j\\in\\text{needle}} \\phi_{t,j} -
\\frac{n}{N_t-n}\\sum_{j\\notin\\text{needle}} \\phi_{t,j}$$

We use the shipped **model organism** `retrieval-long`: a 3-layer Qwen3-architecture
checkpoint with planted literal and non-literal retrieval heads, so it runs on a CPU in
seconds and its retrieval heads are known causally (`MODEL_CARD.md` next to the
checkpoint says how it was made and measured)."""),
        new_code_cell(SETUP),
        new_markdown_cell("""\
## Trials

A `Trial` is a tokenized prompt, the token span `[s, e)` of the needle and the gold
answer. The organism's *non-literal* task: the context holds `NAME LANDMARK` pairs in
filler text, the question names the landmark's **city** (never in the context) and the
answer is the needle's **NAME**, which is not the token a head must attend to find it."""),
        new_code_cell('''\
trials = make_trials("nonliteral", 30, n_tokens=N_TOKENS, book=book, seed=1)
t = trials[0]
words = plot.token_labels(model.tokenizer, t.tokens)
print(f"{len(trials)} trials; the first has {t.n_tokens} tokens, needle span {t.needle_span}, "
      f"answer {t.answer!r}")
print("needle:", words[slice(*t.needle_span)], "| question:", words[-2:])'''),
        new_markdown_cell("""\
## Score every head

`score_trials` decodes each trial greedily once, keeps trials whose answer passes the
ROUGE-1 gate, and averages the contrast over the answer steps and then over trials."""),
        new_code_cell('''\
# answers are one word: 4 new tokens is plenty (the paper's default budget is 50)
scores = locos_tl.score_trials(model, trials, method="locos", max_new_tokens=4)
print({k: scores.meta[k] for k in ("n_trials", "n_accepted", "n_dropped_gate",
                                   "n_dropped_no_answer_step")})
scores.to_frame().head(8).round(3)'''),
        new_markdown_cell("""\
Layer x head map (hover for the bootstrap 95 % CI). Blue heads write the answer from
the needle; red ones write it mostly from elsewhere."""),
        new_code_cell("plot.head_heatmap(scores)"),
        new_markdown_cell("""\
## One answer step up close

`phi_tensor` gives $\\phi$ for every head and key position of one query. Here: the
last prompt position predicting the model's own answer token, drawn around the needle
(`window`; hover for the tokens)."""),
        new_code_cell('''\
res = locos_tl.greedy_decode(model, t.tokens, max_new_tokens=1)
target = res.generated[0]
phi, pattern = locos_tl.phi_tensor(model, t.tokens, target, return_pattern=True)
print("model answers", repr(model.tokenizer.decode([target])), "| gold", repr(t.answer))
s, e = t.needle_span
plot.phi_explorer(phi, words, 0, needle_span=t.needle_span,
                  target=model.tokenizer.decode([target]),
                  window=(max(0, s - 24), min(t.n_tokens, e + 24)))'''),
        new_markdown_cell("""\
The trial's LOCOS score of a head is exactly the spatial contrast of this row (the
answer is one token, so one answer step):"""),
        new_code_cell('''\
import torch

contrast = locos_tl.spatial_contrast(phi, t.needle_span)  # [n_layers, n_heads]
if t.trial_id in scores.trial_ids:
    i = scores.trial_ids.index(t.trial_id)
    torch.testing.assert_close(contrast.double(), scores.trial_scores[i], atol=1e-4, rtol=1e-4)
    print("trial score == contrast of phi: OK")
contrast'''),
        new_markdown_cell("""\
## Save, reload, compare

`HeadScores.save` writes `scores.csv`, `heads.json` (the reference implementation's
`{"layer-head": [per-trial scores]}` format) and `head_scores.json`. The command line
does all of the above in one go:

```bash
locos build-trials organism --task nonliteral --n 30 --length 512 --out trials.jsonl
locos score --model data/organisms/retrieval-long --trials trials.jsonl \\
    --max-new-tokens 4 --out runs/quick
```"""),
        new_code_cell('''\
import tempfile

out = Path(tempfile.mkdtemp()) / "run"
scores.save(out)
again = locos_tl.HeadScores.load(out)
print(sorted(p.name for p in out.iterdir()), "top heads:", again.top_k(3))'''),
    ]


def nb02() -> list:
    return [
        new_markdown_cell("""\
# 02 · Literal vs non-literal retrieval heads: Wu vs LOCOS

The Wu et al. (2025) copy score counts a head as a retrieval head when the token it
attends to most **is** the token the model emits. That finds *literal* retrieval
(copying). In the organism's *non-literal* task the answer (a NAME) is not the token a
head attends to (the LANDMARK): a previous-token head in layer 0 moved the NAME into
the LANDMARK's position, and a layer-1 head reads it from there. LOCOS measures what
a head **writes** toward the answer from the needle, so it sees both."""),
        new_code_cell(SETUP),
        new_markdown_cell(
            "The organism's causally established head roles (from `ground_truth.json`):"),
        new_code_cell(GROUND_TRUTH),
        new_code_cell('''\
import pandas as pd

results = {}
for task in ("literal", "nonliteral"):
    trials = make_trials(task, 30, n_tokens=N_TOKENS, book=book, seed=2)
    results[task] = locos_tl.score_trials(model, trials, methods=["locos", "wu"],
                                          max_new_tokens=4)
    results[task]["trials"] = trials
    print(task, {m: results[task][m].n_trials for m in ("locos", "wu")},
          "accepted trials")'''),
        new_markdown_cell("""\
## Head maps side by side

`normalize=True` puts both methods on one scale (LOCOS is in logits, Wu in attention
probability)."""),
        new_code_cell('''\
plot.head_heatmap([results["nonliteral"]["locos"], results["nonliteral"]["wu"]],
                  normalize=True, title="non-literal trials: LOCOS vs Wu")'''),
        new_code_cell('''\
plot.head_heatmap([results["literal"]["locos"], results["literal"]["wu"]],
                  normalize=True, title="literal trials: LOCOS vs Wu")'''),
        new_markdown_cell("## Who finds the planted heads?"),
        new_code_cell('''\
rows = []
for task in ("literal", "nonliteral"):
    for method in ("locos", "wu"):
        hs = results[task][method]
        top = hs.top_k(3)
        rows.append({"task": task, "method": method,
                     "top-3": ", ".join(locos_tl.head_label(*h) for h in top),
                     **{role: len(set(top) & set(heads)) for role, heads in roles.items()},
                     "max score": float(hs.scores.max())})
pd.DataFrame(rows)'''),
        new_markdown_cell("""\
## Reads vs writes

The top LOCOS head on a non-literal trial: where it looks (attention) and what it
writes toward the answer (phi). It attends to the needle, but the needle token it
reads is the LANDMARK, not the NAME it writes: invisible to a copy score."""),
        new_code_cell('''\
def answer_step(task, head):
    t = results[task]["trials"][0]
    target = locos_tl.greedy_decode(model, t.tokens, max_new_tokens=1).generated[0]
    phi, pattern = locos_tl.phi_tensor(model, t.tokens, target, return_pattern=True)
    words = plot.token_labels(model.tokenizer, t.tokens)
    s, e = t.needle_span  # drawn around the needle (hover for the tokens)
    return plot.reads_vs_writes(pattern, phi, words, head, needle_span=t.needle_span,
                                target=model.tokenizer.decode([target]),
                                window=(max(0, s - 24), min(t.n_tokens, e + 24)))

(nonlit_head,) = results["nonliteral"]["locos"].top_k(1)
answer_step("nonliteral", nonlit_head)'''),
        new_markdown_cell("And the top Wu head on a literal trial, a copying head:"),
        new_code_cell('''\
(lit_head,) = results["literal"]["wu"].top_k(1)
answer_step("literal", lit_head)'''),
        new_markdown_cell("## How much do the two rankings agree?"),
        new_code_cell('''\
plot.rank_scatter(results["nonliteral"]["wu"], results["nonliteral"]["locos"])'''),
    ]


def nb03() -> list:
    return [
        new_markdown_cell("""\
# 03 · Causal evidence: ablation, patching, depth

Scores are hypotheses. Here we test them causally on the organism:

1. **Mean ablation** of each method's top-k heads (query replaced by its mean,
   method.md Sec. 4) against random heads (2 seeds here; the paper uses 3).
2. **Dissociation**: does ablating the heads hurt non-literal retrieval more than a
   question the model answers without a context? $DS(k)$ against a context-free
   control (the organism's echo, scored by exact match), and against the *literal*
   task for specificity to non-literal retrieval.
3. **Activation patching (CRI)** of every head against LOCOS.
4. **Where the heads sit** in depth."""),
        new_code_cell(SETUP),
        new_code_cell(GROUND_TRUTH),
        new_code_cell('''\
detect = make_trials("nonliteral", 20, n_tokens=N_TOKENS, book=book, seed=3)
scores = locos_tl.score_trials(model, detect, methods=["locos", "wu"], max_new_tokens=4)
evals = {task: make_trials(task, 8, n_tokens=N_TOKENS, book=book, seed=4)
         for task in ("nonliteral", "literal")}
# calibration means: mean query / output of each head over held-out prompts
calib = make_trials("nonliteral", 10, N_TOKENS, book=book, seed=5) + make_trials(
    "literal", 10, N_TOKENS, book=book, seed=5)
means = locos_tl.calibrate_means(model, [t.tokens for t in calib], progress=True)'''),
        new_markdown_cell("## Ablation curves"),
        new_code_cell('''\
head_sets = {"locos": scores["locos"], "wu": scores["wu"]}
# To keep this under a few minutes on a CPU: answer + end of sequence (2 new tokens),
# random heads over 2 seeds, no bottom-k control (`bottom="auto"` adds LOCOS's bottom-k).
ablation = {task: locos_tl.evaluate(model, trials, head_sets, k=[1, 2, 4], mode="query_mean",
                                    means=means, seeds=(0, 1), bottom=None, max_new_tokens=2)
            for task, trials in evals.items()}
plot.ablation_curves(ablation["nonliteral"][ablation["nonliteral"].metric == "rougeL"],
                     title="non-literal retrieval after ablating the top-k heads")'''),
        new_code_cell('''\
# the tidy table behind the figure: mean over trials (and seeds) per method and k
ablation["nonliteral"].pivot_table(index="k", columns="method", values="value",
                                   aggfunc="mean").round(2)'''),
        new_markdown_cell("""\
## Dissociation: retrieval vs a control answered without context

$DS(k) = (R_0 - R(k))/R_0 - (P_0 - P(k))/P_0$ (method.md Sec. 4): $R$ the retrieval
metric, $P$ a control metric on questions a model answers from its weights, scored as
the authors do, by exact match after lower-casing and stripping (`scorer="control"`).
For a language model the controls are city -> country and popular-entity facts and
1-digit arithmetic (`locos_tl.build_parametric_trials`, `build_arithmetic_trials`;
`locos build-trials parametric|arithmetic`, then `locos ablate ... --control FILE`).

The organism knows no fact it can state without a context: its one piece of world
knowledge, the landmark -> city map, is read only through the non-literal writers. The
simplest context-free question it answers is the *echo*: the one-word prompt `<s> w`,
answered `w` (it then keeps repeating, so one new token is decoded)."""),
        new_code_cell('''\
from locos_tl.organisms import make_echo_trials

control = make_echo_trials(12, seed=0, top=200)
control_ablation = locos_tl.evaluate(model, control, head_sets, k=[1, 2, 4],
                                     mode="query_mean", means=means, seeds=(0, 1),
                                     bottom=None, scorer="control", max_new_tokens=1)
# R: ROUGE-L on non-literal trials; P: exact match on the echo (the default control metric)
ds = locos_tl.dissociation_score(ablation["nonliteral"], control_ablation)
print(ds.round(3).to_string(index=False))
plot.dissociation(ds, title="DS(k): non-literal drop minus echo-control drop")'''),
        new_markdown_cell("""\
The ground-truth non-literal writers (`ground_truth.json`) ablated together: retrieval
collapses while the echo survives, so $DS$ is clearly positive."""),
        new_code_cell('''\
if roles["nonliteral_writer"]:
    writers = {"writers": roles["nonliteral_writer"]}
    kw = dict(k=[len(roles["nonliteral_writer"])], mode="query_mean", means=means,
              random=False, bottom=None, progress=False)  # a few seconds
    w_ret = locos_tl.evaluate(model, evals["nonliteral"], writers, max_new_tokens=2, **kw)
    w_ctl = locos_tl.evaluate(model, control, writers, scorer="control", max_new_tokens=1,
                              **kw)
    print(locos_tl.dissociation_score(w_ret, w_ctl).round(3).to_string(index=False))'''),
        new_markdown_cell("""\
With the *literal* task as the control instead, $DS(k)$ measures specificity to
non-literal retrieval (both metrics ROUGE-L)."""),
        new_code_cell('''\
ds_lit = locos_tl.dissociation_score(ablation["nonliteral"], ablation["literal"],
                                     retrieval_metric="rougeL", control_metric="rougeL")
plot.dissociation(ds_lit, title="DS(k): non-literal drop minus literal drop")'''),
        new_markdown_cell("""\
## Activation patching (CRI) vs LOCOS

CRI patches each head's clean output into a run whose needle was replaced by filler
and measures how much of the answer's logit margin comes back."""),
        new_code_cell('''\
cri = locos_tl.patch_heads(model, evals["nonliteral"][:4], max_new_tokens=4)
print(locos_tl.compare_rankings(scores["locos"], cri, ks=(2, 4)).round(2).to_string())
plot.rank_scatter(scores["locos"], cri, names=("LOCOS", "CRI"))'''),
        new_markdown_cell("## Where the top heads sit"),
        new_code_cell('''\
plot.layer_distribution([scores["locos"], scores["wu"], cri], k=4)'''),
    ]
def nb04() -> list:
    return [
        new_markdown_cell("""\
# 04 · KV-cache compression guided by head scores

Knowing which heads retrieve suggests a use: keep the full KV cache only for them, and
only the attention sinks plus a recent window for every other head (arXiv 2607.01002
argues this; HeadKV, Fu et al. 2025, allocates budgets from its own head scores). We
measure it on the model organism, whose retrieval heads are known causally.

Protocol (query-agnostic context compression, `docs/compression.md`): the context (the
prompt up to the question, `trial.meta["query_start"]`) is prefilled with the full
cache; the cache is compressed per unit **without seeing the question**; the question
runs through the compressed cache and greedy decoding continues with it. A trial counts
as correct when the first answer token is right. The evicted entries are really gone:
`kv_bytes` is measured from the stored tensors."""),
        new_code_cell('''\
from pathlib import Path

import pandas as pd

import locos_tl
from locos_tl import plot
from locos_tl.experiments.compress import compression_sweep, kv_budgets
from locos_tl.organisms import DEFAULT_ORGANISM, default_book_dir, make_trials

# The default organism (retrieval-long) at 1024 tokens (its MODEL_CARD.md gives the valid
# range: 512-2048), the retained fractions of the KV cache swept, and the evaluation
# trials per task (sized to run in a minute or two on a CPU; the README's table uses 20).
ORGANISM, N_TOKENS = DEFAULT_ORGANISM, 1024
FRACTIONS = (0.1, 0.2, 0.5, 1.0)
N_EVAL = 8

BOOKS = default_book_dir()
book = BOOKS if BOOKS.is_dir() else None
model = locos_tl.load_model(ORGANISM, device="cpu")
cfg = model.cfg
print(f"{Path(ORGANISM).name} at {N_TOKENS} tokens: {cfg.n_layers} layers x {cfg.n_heads} "
      f"heads, {cfg.n_key_value_heads} kv heads a layer; filler:",
      "book" if book else "synthetic")'''),
        new_code_cell(GROUND_TRUTH),
        new_markdown_cell("""\
## Three rankings from one decoding pass

LOCOS, Wu's copy score and HeadKV's retrieval-reasoning score, on detection trials of
both tasks (held apart from the evaluation trials by seed)."""),
        new_code_cell('''\
detect = [t for task in ("literal", "nonliteral")
          for t in make_trials(task, 16, n_tokens=N_TOKENS, book=book, seed=31)]
scores = locos_tl.score_trials(model, detect, methods=["locos", "wu", "headkv"],
                               max_new_tokens=4)
pd.DataFrame({m: [locos_tl.head_label(*h) for h in hs.top_k(6)]
              for m, hs in scores.items()}, index=range(1, 7)).rename_axis("rank")'''),
        new_markdown_cell("""\
Where the top heads sit. `retrieval-long` was grown from `retrieval-2l` by duplicating
its layer 1 into layers 1 and 2; training kept every retrieval function in layer 1 (the
copy in layer 2 does not retrieve), so both detectors put their top heads there."""),
        new_code_cell('''\
plot.layer_distribution([scores["locos"], scores["wu"]], k=6)'''),
        new_markdown_cell("""\
## Budgets

`kv_budgets` turns a ranking into retained entries per unit. With `unit="query_head"`
every query head has its own budget (the exact variant, a mask over its group's
cache); with `unit="kv_group"` the heads that share one kv head under GQA share one
budget, a group scoring as its best head, and eviction frees memory. `"greedy"` gives the
top units the full context until the budget runs out. The share of the context each
query head keeps at 25 %, LOCOS against Wu:"""),
        new_code_cell('''\
context_len = detect[0].meta["query_start"]  # context positions before the question
budgets = {m: kv_budgets(scores[m], 0.25, context_len, cfg.n_key_value_heads,
                         unit="query_head", method=m) for m in ("locos", "wu")}
pd.concat({m: b.to_frame().pivot(index="layer", columns="unit", values="unit_fraction")
           for m, b in budgets.items()}).round(2)'''),
        new_markdown_cell("""\
## The sweep

Every evaluation trial's context is prefilled once; each (ranking, budget) compresses a
copy of that cache. `uniform` (the same budget everywhere) and `random` (a seeded
random ranking) are the controls; HeadKV's scores use HeadKV's proportional
allocation, the others greedy. Both units are swept."""),
        new_code_cell('''\
evals = [t for task in ("literal", "nonliteral")
         for t in make_trials(task, N_EVAL, n_tokens=N_TOKENS, book=book, seed=32)]
rankings = {"locos": scores["locos"], "wu": scores["wu"], "headkv": scores["headkv"]}
sweep = pd.concat([compression_sweep(model, evals, rankings, FRACTIONS, unit=unit,
                                     include=("uniform", "random"), seed=0)
                   for unit in ("query_head", "kv_group")], ignore_index=True)
sweep.pivot_table(index=["unit", "ranking", "fraction"], columns="task",
                  values="correct").round(2).unstack("fraction")'''),
        new_code_cell('''\
plot.compression_curves(sweep[sweep.unit == "query_head"],
                        title=f"per-query-head budgets, {N_TOKENS} tokens")'''),
        new_code_cell('''\
plot.compression_curves(sweep[sweep.unit == "kv_group"],
                        title=f"per-kv-group budgets (real eviction), {N_TOKENS} tokens")'''),
        new_markdown_cell("""\
## Memory

Entries are counted per unit; bytes are the `nbytes` of the stored K/V tensors right
after compression, against the full context cache. Under `kv_group` the bytes follow
the budget (one stored sequence per group); under `query_head` a group stores the
union of its heads' retained positions, so the memory freed is smaller than the share
of entries dropped."""),
        new_code_cell('''\
mem = sweep.groupby(["unit", "ranking", "fraction"]).agg(
    entries_kept=("retained_fraction", "mean"), kv_bytes=("kv_bytes", "sum"),
    full_kv_bytes=("full_kv_bytes", "sum"))
mem["bytes_kept"] = mem.pop("kv_bytes") / mem.pop("full_kv_bytes")
mem.round(3).unstack("fraction")'''),
        new_markdown_cell("""\
## Reading the result

What to look for (issue 13's expectation): at budgets where only a few heads keep their
cache, LOCOS-guided compression keeps **non-literal** accuracy, because LOCOS ranks the
heads that attend to the landmark and write the name; Wu-guided compression keeps the
heads that copy the attended token, so it keeps **literal** accuracy and loses
non-literal accuracy. At 100 % every ranking reproduces plain greedy decoding.

This run has 8 trials a task (one trial moves an accuracy by 0.125; the next cell
prints its numbers). The README's table gives the same sweep on 20 trials a task
(`benchmarks/compression_by_length.py`, whose first 8 trials a task are these). With
per-query-head budgets, at 20 % of the cache LOCOS keeps non-literal accuracy near 1
where Wu's ranking falls to about 0.1, while both keep literal accuracy: LOCOS's top
heads are the two non-literal writers and the literal copiers, Wu's only the copiers.
HeadKV's scores with its proportional allocation land in between. With per-kv-group
budgets the organism has six units (two kv heads in each of three layers): both rankings
put the copiers' group of layer 1 first and the writers' group second (a group scores as
its best head, and Wu gives small positive scores to heads of the writers' group), so they
keep the same groups at every budget and their curves coincide: a ranking of query heads
helps only as finely as the cache is shared."""),
        new_code_cell('''\
qh = sweep[(sweep.unit == "query_head") & sweep.ranking.isin(["locos", "wu"])]
gap = qh.pivot_table(index=["task", "fraction"], columns="ranking", values="correct")
gap["locos - wu"] = gap["locos"] - gap["wu"]
gap.round(2)'''),
    ]


def nb05() -> list:
    return [
        new_markdown_cell("""\
# 05 · A real pretrained LLM: SmolLM2-135M-Instruct

Everything before this notebook ran on model organisms. Here are the paper's experiments
on a real pretrained LLM, **SmolLM2-135M-Instruct** (Llama architecture, 30 layers x 9
heads, 3 kv heads; 4-bit Q4_1 weights dequantized to float32, fetched offline with
`locos models fetch smollm2-135m-instruct`).

The numbers come from `locos reproduce` (one resumable command; the full
protocol is GPU-sized) and are stored in `docs/real_models/smollm2/`, so this notebook
runs in seconds. `docs/real_models.md` reports them beside the paper's Qwen3-8B numbers,
with what holds and what does not, and the command that made them.

Detection uses the non-literal (`onehop`) questions of the shipped `everyday` needle set
in the shipped prose haystack (no named people); the ablation is evaluated on other
names, another seed and another book (*The Last of the Mohicans*)."""),
        new_code_cell('''\
import json
from pathlib import Path

import pandas as pd

import locos_tl
from locos_tl import plot
from locos_tl.runs.rundir import load_head_scores

RESULTS = Path("../docs/real_models/smollm2")
summary = json.loads((RESULTS / "summary.json").read_text())
locos = load_head_scores(RESULTS / "heads/locos/head_scores.json")
wu = load_head_scores(RESULTS / "heads/wu/head_scores.json")  # Wu on the same trials
print(f"{summary['model']}: {summary['n_layers']} layers x {summary['n_heads']} heads")
# accepted trials per detector (each its own gate); a detector with 0 has no ranking
print("accepted detection trials:", summary["n_accepted"])'''),
        new_markdown_cell("""\
## LOCOS and Wu, side by side

LOCOS (logits, what a head writes toward the answer from the needle) and Wu's copy score
(attention: how often the head's top key is the very token it outputs), on the same
non-literal trials. `normalize=True` puts both on [-1, 1]."""),
        new_code_cell('''\
plot.head_heatmap([locos, wu], normalize=True,
                  title="SmolLM2-135M-Instruct: LOCOS vs Wu (onehop trials)")'''),
        new_code_cell('''\
print("top 10 LOCOS:", [locos_tl.head_label(*h) for h in locos.top_k(10)])
print("top 10 Wu:   ", [locos_tl.head_label(*h) for h in wu.top_k(10)])
locos_tl.compare_rankings(locos, wu, ks=(10, 20, 50)).round(3)'''),
        new_code_cell('''\
plot.layer_distribution([locos, wu], k=20)'''),
        new_markdown_cell("""\
## Ablation curves

Query mean ablation (the paper's default) of the top-k heads of each ranking, random
heads (3 seeds) and the bottom-k of LOCOS. Greedy answers are scored by ROUGE-L F
against the character's name and by NoLiMa's "contains", with bootstrap 95 % intervals
over trials (`evaluation_ci.csv`). SmolLM2 answers in sentences, so ROUGE-L F stays low
even when the name is right; "contains" is the readable metric. On the held-out book it
answers 50 % of the literal (`direct`) questions and 18 % of the non-literal (`onehop`)
ones (11 of 60), so the literal sweep has every ranking and k, and the non-literal one
rests on those 11 answers. `headline.csv` has a row per question type and length."""),
        new_code_cell('''\
runs = {p.parent.name: pd.read_csv(p) for p in sorted(RESULTS.glob("ablate/*/evaluation_ci.csv"))}
print("evaluation runs:", list(runs))
pd.read_csv(RESULTS / "headline.csv").round(3)'''),
        new_code_cell('''\
ev = runs.get("direct_1000")
(plot.ablation_curves(ev, metrics=["contains", "rougeL"],
                      title="SmolLM2: literal (direct) questions, 1000 tokens")
 if ev is not None else print("no direct-question run stored"))'''),
        new_code_cell('''\
# every (ranking, k) cell with its interval; random is one row per seed
if ev is not None:
    cols = ["method", "k", "seed", "value", "ci_low", "ci_high", "n_trials"]
    print(ev[ev.metric == "contains"][cols].round(3).to_string(index=False))'''),
        new_code_cell('''\
# the non-literal questions (every ranking, k 1-50)
oh = runs.get("onehop_1000")
(plot.ablation_curves(oh, metrics=["contains", "rougeL"],
                      title="SmolLM2: non-literal (onehop) questions, 1000 tokens")
 if oh is not None else print("no onehop-question run stored"))'''),
        new_markdown_cell("""\
## Dissociation: retrieval against parametric recall and arithmetic

DS(k) = (R0 - R(k)) / R0 - (P0 - P(k)) / P0: 1 when the ablation removes retrieval only,
0 when it hurts both alike. `retrieval_metric` / `control_metric` say which metrics enter:
the paper's pair (ROUGE-L F / exact match) and "contains" on both sides (exact match is 0
for a chat model that answers in a sentence, and DS is then undefined)."""),
        new_code_cell('''\
ds_path = RESULTS / "dissociation.csv"
ds = pd.read_csv(ds_path) if ds_path.exists() else None
(ds[ds.retrieval_metric == "contains"].round(3) if ds is not None and "retrieval_metric" in ds
 else print("no control runs stored"))'''),
        new_code_cell('''\
sub = (ds[(ds.retrieval_metric == "contains") & (ds.control == "parametric")
          & (ds.question == "direct")] if ds is not None and "retrieval_metric" in ds else None)
(plot.dissociation(sub, title="DS(k): direct retrieval vs parametric recall (contains)")
 if sub is not None and sub["ds"].notna().any() else print("DS undefined (a zero baseline)"))'''),
        new_markdown_cell("""\
## Causal check and KV compression

CRI activation patching (filler corruption) on the trials the run could afford, its rank
agreement with LOCOS, and the KV-compression sweep (answer accuracy when each query head
keeps a share of its KV cache set by a ranking)."""),
        new_code_cell('''\
agree = RESULTS / "patch/agreement_locos_cri.csv"
pd.read_csv(agree).round(3) if agree.exists() else print("no CRI patching stored")'''),
        new_code_cell('''\
comp = RESULTS / "compress/accuracy.csv"
acc = pd.read_csv(comp) if comp.exists() else None
# answer accuracy ("contains") per ranking, by question type and retained fraction
(acc.pivot_table(index="ranking", columns=["task", "fraction"], values="accuracy").round(2)
 if acc is not None and "accuracy" in acc else print("no compression sweep stored"))'''),
    ]


def write(name: str, cells: list) -> Path:
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:02d}"  # stable ids: regenerating gives no diff
    nb = new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    })
    path = HERE / name
    nbformat.write(nb, path)
    return path


#: Every notebook: file name -> the function that builds its cells.
NOTEBOOKS: dict[str, Callable[[], list]] = {
    "00_organism.ipynb": nb00,
    "01_quickstart.ipynb": nb01,
    "02_literal_vs_nonliteral.ipynb": nb02,
    "03_causal_evidence.ipynb": nb03,
    "04_kv_compression.ipynb": nb04,
    "05_real_models.ipynb": nb05,
}


def main() -> None:
    for name, build in NOTEBOOKS.items():
        print(write(name, build()).name)  # noqa: T201


if __name__ == "__main__":
    main()
