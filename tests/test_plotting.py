import plotly.graph_objects as go
import pytest
import torch
from conftest import unhooked


def test_cosine_heatmaps_have_fixed_diverging_scale_slider_and_prompt_axes():
    from nope_interp.plotting import plot_cosine_heatmaps

    sim = torch.rand(3, 5, 5, dtype=torch.float64) * 2 - 1
    fig = plot_cosine_heatmaps(sim, ["hook_embed", "blocks.0.attn.hook_z", "blocks.0.hook_resid_post"], "$1+2=")
    assert isinstance(fig, go.Figure) and len(fig.data) == 3
    for trace, s in zip(fig.data, sim, strict=True):
        assert isinstance(trace, go.Heatmap)
        assert (trace.zmin, trace.zmax, trace.zmid) == (-1, 1, 0)
        assert torch.allclose(torch.tensor(trace.z), s)
        assert list(trace.x) == ["0:$", "1:1", "2:+", "3:2", "4:="]
    assert [t.visible for t in fig.data] == [True, False, False]
    assert len(fig.layout.sliders[0].steps) == 3
    assert fig.layout.sliders[0].steps[1].args[0]["visible"] == [False, True, False]


def test_cosine_heatmaps_reject_mismatched_labels():
    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_cosine_heatmaps

    with pytest.raises(NopeInterpError, match="site labels"):
        plot_cosine_heatmaps(torch.zeros(2, 4, 4, dtype=torch.float64), ["a"], "abcd")


def test_adjacency_by_layer_panels_and_error_bars():
    from nope_interp.plotting import plot_adjacency_by_layer

    sites = {"hook_embed": {"mean": 0.5, "std": 0.1}, "blocks.0.attn.hook_z": {"mean": 0.95, "std": 0.02}}
    data = {"addition": {"initialised": sites, "trained": sites}, "reversal": {"initialised": sites}}
    fig = plot_adjacency_by_layer(data)
    assert len(fig.data) == 3
    assert list(fig.data[0].y) == [0.5, 0.95] and list(fig.data[0].error_y.array) == [0.1, 0.02]
    assert [a.text for a in fig.layout.annotations if a.text in ("addition", "reversal")] == ["addition", "reversal"]


def test_lag_profile_panels_per_kind_lines_per_layer_and_the_idealised_curve():
    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_lag_profile

    def prof(m):
        return {"lags": [1, 2, 3], "mean": [m, m / 2, 0.0], "std": [0.1, 0.1, 0.1]}

    profiles = {"hook_embed": prof(0.1), "blocks.0.attn.hook_z": prof(0.9), "blocks.1.attn.hook_z": prof(0.8),
                "blocks.1.hook_resid_post": prof(0.7)}
    fig = plot_lag_profile(profiles, [0.8, 0.6, 0.4], window=2, n_pos=4)
    assert [a.text for a in fig.layout.annotations] == ["embed", "z", "resid_post"]
    lines = [t for t in fig.data if not t.name.startswith("idealised")]
    assert [t.name for t in lines] == ["embed", "L0", "L1", "L1"]
    assert list(lines[1].y) == [0.9, 0.45, 0.0] and list(lines[1].error_y.array) == [0.1, 0.1, 0.1]
    assert lines[2].line.color == lines[3].line.color != lines[1].line.color  # one colour per layer
    ideal = [t for t in fig.data if t.name == "idealised: uniform causal"]
    assert len(ideal) == 3 and list(ideal[0].y) == [0.8, 0.6, 0.4]
    sliding = list(next(t for t in fig.data if t.name.startswith("idealised: sliding")).y)
    assert sliding == pytest.approx([(2**-0.5 + 0.5 + 0.5) / 3, 0.0, 0.0])  # windows {0,1} vs {0}, then 1 - d/w
    with pytest.raises(NopeInterpError, match="lags"):
        plot_lag_profile(profiles, [0.8, 0.6])
    # the sliding-window curve depends on the sequence length, not only on the lags drawn
    with pytest.raises(NopeInterpError, match="window needs n_pos"):
        plot_lag_profile(profiles, [0.8, 0.6, 0.4], window=2)
    for bad in (3, 2, True, 4.0):
        with pytest.raises(NopeInterpError, match="n_pos must be an integer above the largest lag 3"):
            unhooked(plot_lag_profile)(profiles, [0.8, 0.6, 0.4], window=2, n_pos=bad)
    longer = next(t for t in plot_lag_profile(profiles, [0.8, 0.6, 0.4], window=2, n_pos=40).data
                  if t.name.startswith("idealised: sliding"))
    assert list(longer.y) == pytest.approx([(2**-0.5 + 38 * 0.5) / 39, 0.0, 0.0])  # i = 1, then 38 x 1/2
    with pytest.raises(NopeInterpError, match="at least one site"):
        plot_lag_profile({}, [])


def test_save_figure_writes_offline_html(tmp_path):
    from nope_interp.plotting import plot_cosine_heatmaps, save_figure

    fig = plot_cosine_heatmaps(torch.eye(4, dtype=torch.float64)[None], ["x"], "abcd")
    path = save_figure(fig, tmp_path / "figs" / "cos.html")
    html = path.read_text()
    assert '<script src="plotly.min.js"' in html or "plotly.min.js" in html
    assert "cdn.plot.ly" not in html
    js = tmp_path / "figs" / "plotly.min.js"
    assert js.exists() and js.stat().st_size > 1_000_000
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["cos.html", "plotly.min.js"]


def _bundled_plotlyjs() -> bytes:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs().encode("utf-8")


@pytest.mark.parametrize("old", [b"", b"/**\n* plotly.js v1.58.5\n*/\nvar Plotly = {};\n", b"<html>not js</html>",
                                 None])  # None: the right file cut in half
def test_a_stale_empty_or_foreign_plotly_js_beside_the_figures_is_replaced(tmp_path, old):
    from nope_interp.plotting import plot_cosine_heatmaps, save_figure

    want = _bundled_plotlyjs()
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "plotly.min.js").write_bytes(want[: len(want) // 2] if old is None else old)
    save_figure(plot_cosine_heatmaps(torch.eye(3, dtype=torch.float64)[None], ["x"], "abc"), figs / "cos.html")
    assert (figs / "plotly.min.js").read_bytes() == want
    assert sorted(p.name for p in figs.iterdir()) == ["cos.html", "plotly.min.js"]  # no temporary file left


def test_a_current_plotly_js_is_left_untouched_and_each_figure_checks_it(tmp_path):
    from nope_interp.plotting import ensure_plotlyjs, plot_cosine_heatmaps, save_figure

    fig = plot_cosine_heatmaps(torch.eye(3, dtype=torch.float64)[None], ["x"], "abc")
    save_figure(fig, tmp_path / "a.html")
    js = tmp_path / "plotly.min.js"
    inode = js.stat().st_ino
    save_figure(fig, tmp_path / "b.html")
    assert js.stat().st_ino == inode  # not rewritten
    js.write_bytes(b"")  # spoiled between two figures of one process: the next figure repairs it
    save_figure(fig, tmp_path / "c.html")
    assert js.read_bytes() == _bundled_plotlyjs()
    assert ensure_plotlyjs(tmp_path) == js


def test_a_folder_named_plotly_min_js_is_a_one_line_error(tmp_path):
    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_cosine_heatmaps, save_figure

    (tmp_path / "plotly.min.js").mkdir()
    with pytest.raises(NopeInterpError, match="plotly.min.js") as err:
        save_figure(plot_cosine_heatmaps(torch.eye(3, dtype=torch.float64)[None], ["x"], "abc"), tmp_path / "a.html")
    assert "\n" not in str(err.value)


def test_site_labels_given_as_one_string_are_refused():
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_cosine_heatmaps

    with pytest.raises(NopeInterpError, match="single string 'ab'"):
        unhooked(plot_cosine_heatmaps)(torch.zeros(2, 3, 3, dtype=torch.float64), "ab", "xyz")


def test_figures_refuse_values_they_would_draw_wrong_or_not_at_all():
    """Before: a mean of 5 was drawn off the fixed [0, 1.05] axis (unseen), non-square and out-of-range cosine
    matrices were drawn, and a missing "std" or tokens=None failed with KeyError / TypeError."""
    import math

    import torch
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_adjacency_by_layer, plot_cosine_heatmaps

    def one(mean, std=0.1):
        return {"t": {"m": {"blocks.0.attn.hook_z": {"mean": mean, "std": std}}}}

    for bad, words in ((one(5.0), "mean in \\[0, 1\\]"), (one(0.5, -1.0), "std >= 0"), (one(math.inf), "mean in"),
                       ({"t": {"m": {"s": {"mean": 0.5}}}}, "must have 'mean' and 'std'"), ([1], "must be a mapping")):
        with pytest.raises(NopeInterpError, match=f"^plot_adjacency_by_layer: .*{words}"):
            unhooked(plot_adjacency_by_layer)(bad)
    assert plot_adjacency_by_layer(one(math.nan, math.nan)).data   # undefined: drawn as a gap
    ok = torch.eye(3).unsqueeze(0)
    for args, words in (((torch.zeros(2, 5, 3), ["a", "b"], "abc"), "square"),
                        ((ok * 5, ["a"], "abc"), "in \\[-1, 1\\]"), ((ok, [1], "abc"), "site_labels must be strings"),
                        ((ok, ["a"], None), "tokens must be"), ((ok[:0], [], "abc"), "at least 1 along dimension 0")):
        with pytest.raises(NopeInterpError, match=f"^plot_cosine_heatmaps: .*{words}"):
            unhooked(plot_cosine_heatmaps)(*args)
    with_nan = ok.clone()
    with_nan[0, 0, 1] = math.nan   # the cosine of a zero vector: allowed
    assert plot_cosine_heatmaps(with_nan, ["a"], "abc").data
