"""Cells of notebooks 00-02: the organism, the quick start, literal vs non-literal."""

from __future__ import annotations

from cells_shared import FIGURES, GROUND_TRUTH, SETUP  # noqa: F401
from nbformat.v4 import new_code_cell, new_markdown_cell


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
        new_code_cell(FIGURES),
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
        new_markdown_cell("""\
## What we found

The organism answers both tasks: literal accuracy 1.00 at 512 and 1024 tokens,
non-literal 1.00 at 512 and 0.95 at 1024 (20 held-out trials a cell). On 24 non-literal
trials LOCOS ranks the two documented non-literal writers, L1H0 and L1H1, first and
second; its third head, L1H6, is one of the literal copiers."""),
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
        new_code_cell(FIGURES),
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

`phi_from_model` gives $\\phi$ for every head and key position of one query. Here: the
last prompt position predicting the model's own answer token, drawn around the needle
(`window`; hover for the tokens)."""),
        new_code_cell('''\
res = locos_tl.greedy_decode(model, t.tokens, max_new_tokens=1)
target = res.generated[0]
phi, pattern = locos_tl.phi_from_model(model, t.tokens, target, return_pattern=True)
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
again = locos_tl.load_head_scores(out)  # reads any folder the package writes
print(sorted(p.name for p in out.iterdir()), "top heads:", again.top_k(3))'''),
        new_markdown_cell("""\
## What we found

LOCOS scored every head from 29 of 30 non-literal trials (one failed the answer gate).
Two heads stand out, L1H0 at 61.0 [55.1, 67.0] and L1H1 at 53.9 [47.2, 60.6] logits:
the organism's non-literal writers. The next head, L1H5, scores 2.6. A trial's score of
a head is the needle contrast of that head's row of phi, as checked above."""),
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
        new_code_cell(FIGURES),
        new_code_cell(SETUP),
        new_markdown_cell(
            "The organism's causally established head roles (from `ground_truth.json`):"),
        new_code_cell(GROUND_TRUTH),
        new_code_cell('''\
import pandas as pd

results = {}
for task in ("literal", "nonliteral"):
    trials = make_trials(task, 30, n_tokens=N_TOKENS, book=book, seed=2)
    results[task] = locos_tl.score_methods(model, trials, methods=["locos", "wu"],
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
    phi, pattern = locos_tl.phi_from_model(model, t.tokens, target, return_pattern=True)
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
        new_markdown_cell("""\
## What we found

On literal trials both methods find the planted copiers: each top 3 holds three literal
copy heads. On non-literal trials LOCOS's top 3 holds both non-literal writers (L1H0,
L1H1), while Wu's (L2H3, L0H0, L0H1) holds no planted head, and its largest score is
0.017 against 0.50 on literal trials. The writers attend to the landmark and write the
name, so a copy score cannot see them; what they write can."""),
    ]
