"""Cells of notebook 06: the elicited model `smollm2-135m-nolima-v1`, from its published
results (no model is loaded)."""

from __future__ import annotations

from cells_shared import FIGURES
from nbformat.v4 import new_code_cell, new_markdown_cell


def nb06() -> list:
    return [
        new_markdown_cell("""\
# 06 · Non-literal retrieval on a real model: `smollm2-135m-nolima-v1`

SmolLM2-135M-Instruct rarely makes the hop of a non-literal (NoLiMa-style) question, so
notebook 05 could not test LOCOS's central claim on it. `smollm2-135m-nolima-v1` is the
same model with a LoRA adapter on its MLPs, trained with `locos elicit` until it makes
the hop. Its attention weights are the base model's, bit for bit.

This notebook reads the published results in `docs/real_models/smollm2-nolima/`
(`experiments/elicited_targets.py` and `locos reproduce`; `docs/elicited.md` gives the
commands and the full tables) and loads no model, so it runs in seconds. The questions
are held out: links, names and book (*The Last of the Mohicans*) were never trained on.
One distractor needle, 1000-token prompts, chat template, greedy answers."""),
        new_code_cell(FIGURES),
        new_code_cell('''\
import pandas as pd

import locos_tl
from locos_tl import plot

# the published results, found from here (notebooks/) or from the repository root
ROOT = next(p for p in (Path.cwd(), *Path.cwd().parents) if (p / "docs/real_models").is_dir())
RESULTS = ROOT / "docs/real_models/smollm2-nolima"
BASE_LITERAL = ROOT / "docs/real_models/smollm2-literal"  # the base model, literal trials
print(sorted(p.name for p in RESULTS.iterdir()))'''),
        new_markdown_cell("""\
## The hop, before and after eliciting

`targets.csv`: the share of answers naming the target and naming a distractor, and the
name margin (log P(target's name) minus the best distractor's, teacher-forced at the
answer position, in nats), for the base model and the elicited one. `onehop` is the
non-literal question, `direct` the literal one (it names what the needle says)."""),
        new_code_cell('''\
targets = pd.read_csv(RESULTS / "targets.csv")
targets["model"] = targets["model"].map({"smollm2-135m-instruct": "base",
                                         "smollm2-135m-nolima-v1": "elicited"})
hop = targets[targets.distractors.notna()].astype({"length": int, "distractors": int, "n": int})
hop.pivot_table(index=["question", "length", "distractors", "n"], columns="model",
                values=["target", "distractor", "name_margin"])[
    ["target", "distractor", "name_margin"]].round(2)'''),
        new_code_cell('''\
# general ability, before and after ("contains" for the questions; perplexity of the book)
targets[targets.distractors.isna()].pivot_table(index="question", columns="model",
                                                values="target").round(2)'''),
        new_markdown_cell("""\
The hop is learned (`onehop` from 0.12 to 0.60 with the distractor at 0.05), and it
cost general ability: perplexity up, parametric recall and arithmetic near the floor.

## Which heads does LOCOS rank?

LOCOS on 60 `onehop` detection trials (a trial counts when the answer names the target
and no distractor), beside direct logit attribution (DLA: what a head writes from the
needle, without LOCOS's contrast against the rest of the context)."""),
        new_code_cell('''\
locos = locos_tl.load_head_scores(RESULTS / "heads/locos/head_scores.json")
dla = locos_tl.load_head_scores(RESULTS / "heads/dla/head_scores.json")
print(f"{locos.scores.shape[0]} layers x {locos.scores.shape[1]} heads; "
      f"{locos.n_trials} accepted trials")
print("top 10 LOCOS:", [locos_tl.head_label(*h) for h in locos.top_k(10)])
print("top 10 DLA:  ", [locos_tl.head_label(*h) for h in dla.top_k(10)])
plot.head_heatmap([locos, dla], normalize=True,
                  title="smollm2-135m-nolima-v1, onehop trials: LOCOS vs DLA")'''),
        new_markdown_cell("""\
## Ablating the top heads

Query-mean ablation of each ranking's top k heads (ranked on the detection trials),
evaluated on 60 other held-out trials: the share of answers that name the target.
Bands: the bootstrap 95 % interval over the trials of each cell (`evaluation_ci.csv`;
for the random heads, whose 3 seeds are 3 cells, from the lowest to the highest bound);
error bars on the random line: one standard deviation over the seeds. Controls (random,
LOCOS's bottom k) are dotted."""),
        new_code_cell('''\
def curves(question, metric="contains"):
    """The ablation curves of one question type; bands: each cell's bootstrap interval."""
    ev = pd.read_csv(RESULTS / f"ablate/{question}_1000/evaluation_ci.csv")
    fig = plot.ablation_curves(ev, metrics=[metric],
                               title=f"smollm2-135m-nolima-v1: {question}, 1000 tokens")
    return fig, ev


fig, onehop = curves("onehop")
fig'''),
        new_code_cell('''\
# the cells behind the figure, at k = 5 (random: one row per seed)
cols = ["method", "k", "seed", "value", "ci_low", "ci_high", "n_trials"]
onehop[(onehop.metric == "contains") & onehop.k.isin([0, 5])][cols].round(2)'''),
        new_code_cell('''\
fig, direct = curves("direct")
fig'''),
        new_markdown_cell("""\
Paired tests on the same trials (`paired.csv`): McNemar's test on "names the target"
and Wilcoxon's on the name margin, LOCOS's top 5 against each other ranking of 5 heads.
Against random heads McNemar tests each of the 3 seeds alone and reports the largest p;
Wilcoxon compares with the seeds' mean margin per trial."""),
        new_code_cell('''\
paired = pd.read_csv(RESULTS / "paired.csv")
paired[(paired.k == 5) & (paired.method == "locos")][
    ["question", "against", "n_trials", "contains", "contains_against", "p_mcnemar",
     "p_wilcoxon"]].round({"contains": 2, "contains_against": 2})'''),
        new_markdown_cell("""\
At k = 5 the cells also ran on 200 held-out trials (the 60 above and 140 more from
the same sampler; nothing was chosen on them), `n200/`:"""),
        new_code_cell('''\
n200 = pd.concat([pd.read_csv(RESULTS / f"n200/ablate/{q}_1000/evaluation_ci.csv")
                  .assign(question=q) for q in ("onehop", "direct")])
n200[n200.metric == "contains"][["question"] + cols].round(2)'''),
        new_markdown_cell("""\
## Where the elicited model's heads come from

Eliciting changed only the MLPs, so the heads that carry the hop are heads the base
model already had. The base model's LOCOS ranking on *literal* trials
(`docs/real_models/smollm2-literal/`) beside the elicited model's on non-literal ones:"""),
        new_code_cell('''\
from dataclasses import replace

base_literal = locos_tl.load_head_scores(BASE_LITERAL / "heads/locos/head_scores.json")
n_heads = locos.scores.numel()
shared = set(locos.top_k(10)) & set(base_literal.top_k(10))
print(f"top 10 shared: {len(shared)} of 10 (chance: {10 * 10 / n_heads:.2f})",
      sorted(locos_tl.head_label(*h) for h in shared))
plot.head_heatmap([replace(locos, method="elicited, onehop"),
                   replace(base_literal, method="base, literal")], normalize=True,
                  title="LOCOS heads: the elicited model's and the base model's")'''),
        new_code_cell('''\
# rank agreement of every pair of rankings (Spearman over all heads; shared heads in the
# top 5/10/20 with a hypergeometric p-value)
overlap = pd.read_csv(RESULTS / "head_overlap.csv")
overlap[["pair", "spearman", "top5_shared", "top10_shared", "top10_p", "top20_shared"]].round(
    {"spearman": 2})'''),
        new_markdown_cell("""\
## What we found

Eliciting taught SmolLM2-135M-Instruct the hop: held-out `onehop` questions go from
0.12 to 0.60 naming the target, with a distractor named in 0.05. Ablating LOCOS's top 5
heads takes that to 0.05 [0.00, 0.12] on 60 trials and 0.02 on 200, where Wu's top 5
leave 0.40, DLA's top 5 0.40 and 5 random heads 0.42-0.57 (McNemar p = 5e-7 against
random heads, the largest p over the 3 seeds). The same heads carry literal retrieval too (`direct` 0.85 ->
0.07), and 8 of the elicited model's top 10 LOCOS heads are among the base model's top
10 on literal trials (chance 0.37; Spearman 0.68 over 270 heads): the MLP-only
fine-tune routed the hop through retrieval heads the pretrained model already had."""),
    ]
