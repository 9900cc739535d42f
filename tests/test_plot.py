"""Each figure of ``locos_tl.plot`` on real scores of a tiny model: traces, axes, hover."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
from plot_data import N_HEADS, N_LAYERS, ablation_frame, shared

from locos_tl import plot


@pytest.fixture(scope="module")
def data():
    return shared()


def test_head_heatmap_single(data):
    hs = data.scores["locos"]
    fig = plot.head_heatmap(hs)
    assert isinstance(fig, go.Figure)
    (tr,) = fig.data
    assert tr.type == "heatmap"
    assert np.asarray(tr.z).shape == (N_LAYERS, N_HEADS)
    np.testing.assert_allclose(np.asarray(tr.z, dtype=float), hs.scores.numpy())
    assert fig.layout.xaxis.title.text == "Head"
    assert fig.layout.yaxis.title.text == "Layer"
    assert fig.layout.yaxis.autorange == "reversed"
    assert fig.layout.coloraxis.cmid == 0
    assert fig.layout.coloraxis.cmin == -fig.layout.coloraxis.cmax
    assert "customdata[0]" in tr.hovertemplate and "95% CI" in tr.hovertemplate
    custom = np.asarray(tr.customdata)
    assert custom[2, 3, 0] == "L2H3"
    assert float(custom[2, 3, 1]) == pytest.approx(float(hs.scores[2, 3]), rel=1e-3)
    assert str(hs.n_trials) in fig.layout.title.text
    assert plot.head_heatmap(hs, title="mine").layout.title.text == "mine"


def test_head_heatmap_side_by_side_shares_scale(data):
    a, b = data.scores["locos"], data.scores["attention_spatial"]
    fig = plot.head_heatmap([a, b])
    assert [t.type for t in fig.data] == ["heatmap", "heatmap"]
    assert {t.coloraxis for t in fig.data} == {"coloraxis"}
    vmax = max(np.nanmax(np.abs(a.scores.numpy())), np.nanmax(np.abs(b.scores.numpy())))
    assert fig.layout.coloraxis.cmax == pytest.approx(vmax)
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "Head"
    assert [ann.text.split(" ")[0] for ann in fig.layout.annotations] == ["locos",
                                                                           "attention_spatial"]
    assert "attention_spatial" in fig.data[1].hovertemplate
    norm = plot.head_heatmap([a, b], normalize=True)
    assert norm.layout.coloraxis.cmax == pytest.approx(1.0)


def _drawn(fig, i=0):
    """``z`` and the hover's head labels of the ``i``-th heatmap."""
    tr = fig.data[i]
    return np.asarray(tr.z, dtype=float), np.asarray(tr.customdata)[..., 0]


def test_head_heatmap_takes_tensor_array_and_frames(data):
    """A raw tensor, an array, ``to_frame()``'s long form and a wide layer x head frame
    draw the same map as the HeadScores, with the same head labels."""
    hs = data.scores["locos"]
    want = hs.scores.numpy()
    labels = np.array([[f"L{l}H{h}" for h in range(N_HEADS)] for l in range(N_LAYERS)])
    wide = hs.to_frame().pivot(index="layer", columns="head", values="score")
    inputs = {"tensor": hs.scores, "array": want, "long": hs.to_frame(), "wide": wide}
    for kind, x in inputs.items():
        fig = plot.head_heatmap(x)
        z, lab = _drawn(fig)
        np.testing.assert_array_equal(z, want, err_msg=kind)
        assert (lab == labels).all(), kind
        assert fig.layout.yaxis.autorange == "reversed"
    low, high = (t.numpy() for t in hs.ci)
    custom = np.asarray(plot.head_heatmap(hs.to_frame()).data[0].customdata)
    assert float(custom[2, 3, 2]) == pytest.approx(low[2, 3], rel=1e-3)  # CI from the frame
    assert float(custom[2, 3, 3]) == pytest.approx(high[2, 3], rel=1e-3)
    assert plot.head_heatmap(hs.to_frame()).layout.title.text == (
        f"locos head scores ({hs.n_trials} trials)")
    assert np.asarray(plot.head_heatmap(hs.scores).data[0].customdata)[2, 3, 2] == "n/a"
    # a wide frame of only some layers keeps their numbers (the rest are empty rows)
    z, lab = _drawn(plot.head_heatmap(wide.loc[[1, 3]]))
    assert z.shape == (4, N_HEADS) and np.isnan(z[[0, 2]]).all()
    np.testing.assert_array_equal(z[3], want[3])
    # names: a dict's keys; a long frame of several methods is one map per method
    both = pd.concat([hs.to_frame(), data.scores["wu"].to_frame()])
    fig = plot.head_heatmap(both)
    assert [t.name for t in fig.data] == ["locos", "wu"]
    np.testing.assert_array_equal(_drawn(fig, 1)[0], data.scores["wu"].scores.numpy())
    fig = plot.head_heatmap({"mine": hs.scores, "wu": data.scores["wu"]})
    assert [t.name for t in fig.data] == ["mine", "wu"]
    with pytest.raises(ValueError, match=r"\[n_layers, n_heads\].*shape \(4,\)"):
        plot.head_heatmap(hs.scores[0])
    with pytest.raises(ValueError, match=r"L0H\d appears twice \(row \d+\)"):
        plot.head_heatmap(hs.to_frame().assign(layer=0))
    with pytest.raises(ValueError, match="not numeric"):
        plot.head_heatmap(hs.to_frame()[["label", "score"]])


def test_head_heatmap_scale_shared_or_per_map(data):
    """``scale="shared"``: every map in its own units on one colour scale; ``"per_map"``:
    each map divided by its own max |score|, which its subplot title gives. The colour
    bar says which."""
    a, b = data.scores["locos"], data.scores["attention_spatial"]
    za, zb = a.scores.numpy(), b.scores.numpy()
    ma, mb = np.nanmax(np.abs(za)), np.nanmax(np.abs(zb))
    shared = plot.head_heatmap([a, b], scale="shared")
    np.testing.assert_array_equal(_drawn(shared, 1)[0], zb)
    assert shared.layout.coloraxis.cmax == pytest.approx(max(ma, mb))
    assert shared.layout.coloraxis.colorbar.title.text == "score, one scale for all maps"
    per = plot.head_heatmap([a, b], scale="per_map")
    np.testing.assert_allclose(_drawn(per, 0)[0], za / ma, rtol=1e-12)
    np.testing.assert_allclose(_drawn(per, 1)[0], zb / mb, rtol=1e-12)
    assert per.layout.coloraxis.cmax == 1.0
    assert per.layout.coloraxis.colorbar.title.text == "score / the map's own max |score|"
    assert [ann.text.split("<br>")[1] for ann in per.layout.annotations] == [
        f"max |score| {ma:.4g}", f"max |score| {mb:.4g}"]
    assert float(np.asarray(per.data[1].customdata)[2, 3, 1]) == pytest.approx(
        zb[2, 3], rel=1e-3)  # hover keeps the score in its own units
    old = plot.head_heatmap([a, b], normalize=True)
    np.testing.assert_array_equal(_drawn(old, 1)[0], _drawn(per, 1)[0])
    with pytest.raises(ValueError, match="contradicts scale='shared'"):
        plot.head_heatmap([a, b], normalize=True, scale="shared")


def test_layer_distribution(data):
    hs = data.scores["locos"]
    k = 5
    fig = plot.layer_distribution([hs, data.scores["dla"]], k)
    assert [t.type for t in fig.data] == ["bar"] * 4
    by_layer, by_depth = fig.data[0], fig.data[1]
    assert list(by_layer.x) == list(range(N_LAYERS))
    assert sum(by_layer.y) == k
    expected = np.bincount([l for l, _ in hs.top_k(k)], minlength=N_LAYERS)
    assert list(by_layer.y) == list(expected)
    assert sum(by_depth.y) == pytest.approx(1.0)
    assert all(0 <= x <= 1 for x in by_depth.x)
    top_label = "L{}H{}".format(*hs.top_k(1)[0])
    assert any(top_label in c for c in by_layer.customdata)
    assert fig.layout.xaxis.title.text == "Layer"
    assert "normalised depth" in fig.layout.xaxis2.title.text
    assert fig.layout.yaxis2.title.text == "fraction of top-k heads"


def test_rank_scatter(data):
    from scipy.stats import spearmanr

    a, b = data.scores["locos"], data.scores["dla"]
    fig = plot.rank_scatter(a, b)
    (tr,) = fig.data
    assert tr.type == "scatter" and tr.mode == "markers"
    assert len(tr.x) == N_LAYERS * N_HEADS
    assert list(tr.marker.color) == [l for l in range(N_LAYERS) for _ in range(N_HEADS)]
    rho = spearmanr(a.scores.flatten(), b.scores.flatten()).statistic
    assert f"Spearman ρ = {rho:.2f}" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "locos score"
    assert fig.layout.yaxis.title.text == "dla score"
    assert tr.customdata[0][0] == "L0H0" and "rank" in tr.hovertemplate
    r = plot.rank_scatter(a, b, ranks=True, names=("LOCOS", "CRI"))
    assert sorted(r.data[0].x) == list(range(1, N_LAYERS * N_HEADS + 1))
    assert r.layout.xaxis.title.text == "LOCOS rank"
    with pytest.raises(ValueError, match="one shape"):
        plot.rank_scatter(a, b.scores[:2])


def test_ablation_curves():
    df = ablation_frame()
    fig = plot.ablation_curves(df)
    names = [t.name for t in fig.data if t.xaxis == "x"]
    assert names == ["locos", "wu", "random", "locos_bottom"]  # baseline is each k=0 point
    assert len(fig.data) == 8  # 4 methods x 2 metrics
    locos, rnd, bottom = fig.data[0], fig.data[2], fig.data[3]
    assert list(rnd.x) == [0, 1, 2, 4, 8]
    assert locos.y[0] == pytest.approx(0.8)  # baseline rougeL
    assert rnd.error_y.visible and all(e > 0 for e in rnd.error_y.array[1:])
    assert not locos.error_y.visible
    assert rnd.line.dash == bottom.line.dash == "dot" and locos.line.dash == "solid"
    expected = df[(df.method == "random") & (df.metric == "rougeL")].groupby("k").value.mean()
    np.testing.assert_allclose(rnd.y[1:], expected.values)
    assert fig.layout.xaxis.title.text == "k (heads ablated)"
    assert fig.layout.yaxis.title.text == "rougeL"
    assert fig.layout.yaxis2.title.text == "contains"
    assert "seeds" in rnd.hovertemplate and "trials" in rnd.hovertemplate
    log = plot.ablation_curves(df, metrics=["rougeL"], log_x=True)
    assert log.layout.xaxis.type == "log" and list(log.data[0].x) == [1, 2, 4, 8]
    assert [s.type for s in log.layout.shapes] == ["line"]  # the no-ablation level
    with pytest.raises(ValueError, match="lacks column"):
        plot.ablation_curves(df.drop(columns="seed"))


def test_ablation_curves_interval_bands():
    """With ``ci_low``, ``ci_high`` (``ablation_sweep(ci=...)``), each ranking's line is
    preceded by a filled band from low to high; several seeds: their envelope."""
    df = ablation_frame()
    df = df.assign(ci_low=df["value"] - 0.05, ci_high=df["value"] + 0.05)
    fig = plot.ablation_curves(df)
    bands = [t for t in fig.data if t.fill == "toself"]
    lines = [t for t in fig.data if t.fill != "toself"]
    assert [t.name for t in bands if t.xaxis == "x"] == [
        "locos interval", "wu interval", "random interval", "locos_bottom interval"]
    assert len(bands) == len(lines) == 8 and all(not t.showlegend for t in bands)
    locos_band, locos = fig.data[0], fig.data[1]
    assert locos.name == "locos" and locos_band.legendgroup == "locos"
    n = len(locos.x)
    assert list(locos_band.x) == [*locos.x, *locos.x[::-1]]
    np.testing.assert_allclose(locos_band.y[:n], np.asarray(locos.y) + 0.05)
    np.testing.assert_allclose(locos_band.y[n:], (np.asarray(locos.y) - 0.05)[::-1])
    rnd = next(t for t in bands if t.name == "random interval" and t.xaxis == "x")
    sel = df[(df.method == "random") & (df.metric == "rougeL") & (df.k == 8)]
    assert rnd.y[n - 1] == pytest.approx(sel["ci_high"].max())  # k = 8, the seeds' top
    assert rnd.y[n] == pytest.approx(sel["ci_low"].min())
    assert not [t for t in plot.ablation_curves(ablation_frame()).data if t.fill]


def test_dissociation():
    from locos_tl.experiments.dissociation import dissociation_score

    retrieval, control = ablation_frame(), ablation_frame((("contains", 0.9),), scale=0.1)
    ds = dissociation_score(retrieval, control, retrieval_metric="rougeL",
                            control_metric="contains")
    fig = plot.dissociation(ds)
    assert [t.name for t in fig.data] == list(dict.fromkeys(ds.method))
    locos = next(t for t in fig.data if t.name == "locos")
    np.testing.assert_allclose(locos.y, ds[ds.method == "locos"].sort_values("k").ds)
    assert fig.layout.yaxis.title.text == "DS(k)"
    assert fig.layout.xaxis.title.text == "k (heads ablated)"
    assert "DS=" in locos.hovertemplate
    per_seed = pd.DataFrame({"method": "random", "k": [1, 1, 2, 2], "seed": [0, 1, 0, 1],
                             "ds": [0.1, 0.3, 0.2, 0.4]})
    (tr,) = plot.dissociation(per_seed).data
    np.testing.assert_allclose(tr.y, [0.2, 0.3])
    assert tr.error_y.visible
    with pytest.raises(ValueError, match="lacks column"):
        plot.dissociation(retrieval)


def test_phi_explorer(data):
    phi, toks, span = data.phi, data.tokens, data.needle_span
    fig = plot.phi_explorer(phi, toks, 0, needle_span=span, target=data.target)
    (tr,) = fig.data
    assert np.asarray(tr.z).shape == (N_LAYERS * N_HEADS, len(toks))
    np.testing.assert_allclose(np.asarray(tr.z)[N_HEADS + 2], phi[1, 2].numpy(), rtol=1e-6)
    assert list(fig.layout.yaxis.ticktext)[N_HEADS + 2] == "L1H2"
    assert list(fig.layout.xaxis.ticktext) == toks
    (rect,) = fig.layout.shapes
    assert (rect.x0, rect.x1) == (span[0] - 0.5, span[1] - 0.5)
    assert tr.customdata[0][span[0]][0] == toks[span[0]]
    assert "phi=" in tr.hovertemplate and "customdata[0]" in tr.hovertemplate
    assert "step 0" in fig.layout.title.text and repr(data.target) in fig.layout.title.text
    sub = plot.phi_explorer(phi, toks, needle_span=span, heads=[(3, 1)], window=(5, 20))
    assert np.asarray(sub.data[0].z).shape == (1, 15)
    assert list(sub.data[0].x) == list(range(5, 20))
    with pytest.raises(ValueError, match="token strings"):
        plot.phi_explorer(phi, toks[:-1])


def test_reads_vs_writes(data):
    phi, pattern, toks, span = data.phi, data.pattern, data.tokens, data.needle_span
    fig = plot.reads_vs_writes(pattern[2, 1], phi[2, 1], toks, (2, 1), needle_span=span,
                               target=data.target)
    att, wr = fig.data
    assert att.type == wr.type == "bar"
    np.testing.assert_allclose(att.y, pattern[2, 1].numpy(), rtol=1e-6)
    np.testing.assert_allclose(wr.y, phi[2, 1].numpy(), rtol=1e-6)
    assert fig.layout.yaxis.title.text == "attention"
    assert fig.layout.yaxis2.title.text == "phi (logits)"
    assert fig.layout.xaxis2.title.text == "key position (token)"
    assert len(fig.layout.shapes) == 2
    assert fig.layout.title.text.startswith("L2H1")
    assert "attention on needle" in fig.layout.title.text
    assert "α=" in att.hovertemplate and "φ=" in wr.hovertemplate
    same = plot.reads_vs_writes(pattern, phi, toks, "L2H1", needle_span=span)
    np.testing.assert_allclose(same.data[1].y, wr.y)
    with pytest.raises(ValueError, match="one length"):
        plot.reads_vs_writes(pattern[2, 1], phi[2, 1], toks[:-1], (2, 1))


def test_token_labels(data):
    tok = data.model.tokenizer
    ids = tok("a\nb")["input_ids"]
    labels = plot.token_labels(data.model, ids)
    assert len(labels) == len(ids) and "".join(labels) == "a⏎b"


def test_frames_roundtrip_through_html(data, tmp_path):
    """Every figure serialises to a self-contained HTML file (what the CLI writes)."""
    figs = [plot.head_heatmap(data.scores["locos"]), plot.ablation_curves(ablation_frame())]
    for i, fig in enumerate(figs):
        p = tmp_path / f"f{i}.html"
        fig.write_html(p, include_plotlyjs=True)
        assert p.stat().st_size > 100_000


def test_rank_scatter_constant_scores(data):
    a = data.scores["locos"]
    fig = plot.rank_scatter(a, np.zeros((N_LAYERS, N_HEADS)), names=("locos", "flat"))
    assert "undefined" in fig.layout.title.text


def test_k_axis_ticks_are_the_swept_k():
    fig = plot.ablation_curves(ablation_frame())
    assert list(fig.layout.xaxis.tickvals) == [0, 1, 2, 4, 8]
    log = plot.ablation_curves(ablation_frame(), log_x=True)
    assert list(log.layout.xaxis.tickvals) == [1, 2, 4, 8]
