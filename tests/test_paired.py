"""Paired tests of the protocol: McNemar's exact p against the binomial sum, the pairing
of trials and random seeds, Wilcoxon on the name margin."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import wilcoxon

from locos_tl.experiments.protocol.paired import mcnemar_p, paired_table


def _exact(b: int, c: int) -> float:
    n, m = b + c, min(b, c)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(m + 1)) / 2 ** n)


@pytest.mark.parametrize(("b", "c"), [(0, 7), (3, 9), (5, 5), (1, 0), (12, 2)])
def test_mcnemar_is_the_exact_binomial_sum(b, c):
    a = np.array([1] * b + [0] * c + [1] * 4 + [0] * 3)
    x = np.array([0] * b + [1] * c + [1] * 4 + [0] * 3)
    assert mcnemar_p(a, x) == pytest.approx(_exact(b, c), rel=1e-12)
    assert mcnemar_p(a, a) == 1.0


def _values(rng, n=20):
    rows = []
    cells = [("locos", 5, 0), ("wu", 5, 0), ("random", 5, 0), ("random", 5, 1),
             ("dla", 10, 0)]
    for method, k, seed in cells:
        for t in range(n):
            contains = float(rng.random() < (0.2 if method == "locos" else 0.7))
            rows += [{"method": method, "k": k, "seed": seed, "trial": f"t{t}",
                      "metric": "contains", "value": contains},
                     {"method": method, "k": k, "seed": seed, "trial": f"t{t}",
                      "metric": "name_margin", "value": float(rng.normal())}]
    return pd.DataFrame(rows)


def test_pairs_on_the_same_trials_and_pool_random_seeds():
    values = _values(np.random.default_rng(0))
    table = paired_table(values).set_index(["method", "against", "k"])
    assert ("dla", "random", 10) not in table.index  # no shared k
    row = table.loc[("locos", "random", 5)]
    v = values.pivot_table(index=["method", "seed", "trial"], columns="metric",
                           values="value")
    loc = v.loc[("locos", 0)]
    r0, r1 = v.loc[("random", 0)], v.loc[("random", 1)]
    assert row["n_trials"] == 20
    assert row["contains"] == pytest.approx(loc["contains"].mean())
    assert row["contains_against"] == pytest.approx((r0["contains"] + r1["contains"]).mean() / 2)
    want = max(mcnemar_p(loc["contains"], r0["contains"]),
               mcnemar_p(loc["contains"], r1["contains"]))
    assert row["p_mcnemar"] == pytest.approx(want)
    margin = (r0["name_margin"] + r1["name_margin"]) / 2
    assert row["p_wilcoxon"] == pytest.approx(wilcoxon(loc["name_margin"] - margin).pvalue)
    assert row["name_margin_against"] == pytest.approx(margin.mean())
    assert table.loc[("locos", "wu", 5), "p_mcnemar"] < 0.05  # 0.2 against 0.7


def test_the_table_refuses_concatenated_sweeps_and_ties_random_seeds_equal_to_a_ranking():
    values = _values(np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"200 \(trial, method, k, seed, metric\) record\(s\) "
                       r"occur in more than one row \(400 rows\): \(trial 't0', method "
                       r"'locos', k 5, seed 0, metric 'contains'\) x2"):
        paired_table(pd.concat([values, values], ignore_index=True))
    # random heads whose every seed answers as LOCOS does (margins 0.1 * i: (3u)/3 != u)
    locos = values[values["method"] == "locos"].assign(
        value=lambda d: np.where(d["metric"] == "name_margin",
                                 0.1 * d["trial"].str[1:].astype(int), d["value"]))
    same = pd.concat([locos, *(locos.assign(method="random", seed=s) for s in (0, 1, 2))])
    row = paired_table(same, [("locos", "random")]).iloc[0]
    assert (row["p_mcnemar"], row["p_wilcoxon"]) == (1.0, 1.0)
