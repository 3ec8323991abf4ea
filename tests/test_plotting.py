import math

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


def test_every_slider_step_has_a_short_label_with_room_for_it():
    """Before: the steps were labelled with the full hook names, and plotly draws only the labels that fit (every
    k-th, its labelStride): a 2-layer model's slider labelled every third site, one of 3 layers x 10 sites every
    tenth. Now the short labels, a word per line, on a figure as wide as they need (up to 1600 pixels)."""
    from nope_interp.hooks import activation_hook_names
    from nope_interp.plotting import plot_cosine_heatmaps

    for n_layers, width in ((2, 760), (3, 760), (6, 1116), (10, 1600)):
        sites = activation_hook_names(n_layers)
        fig = plot_cosine_heatmaps(torch.eye(4, dtype=torch.float64).repeat(len(sites), 1, 1), sites, "abcd", "t")
        steps = fig.layout.sliders[0].steps
        assert [s.label for s in steps[:4]] == ["embed", "L0<br>resid<br>pre", "L0<br>z", "L0<br>resid<br>mid"]
        assert steps[-1].label == f"L{n_layers - 1}<br>resid<br>post" and [s.value for s in steps] == sites
        assert steps[2].args[1] == {"title.text": "t<br>blocks.0.attn.hook_z"}  # the title names the site in full
        assert fig.layout.width == width and fig.layout.sliders[0].font.size == 10
        # plotly draws every label when the widest, with its padding of 8 pixels, fits between two steps (the first
        # and last 10 pixels in); 6.2 pixels a character at size 10 in Verdana, the widest of its default fonts
        widest = max(len(line) for s in steps for line in s.label.split("<br>")) * 6.2 + 8
        room = (width - fig.layout.margin.l - fig.layout.margin.r - 20) / (len(steps) - 1)
        assert (room >= widest) == (n_layers < 10), n_layers  # 41 sites: past the widest figure
        assert fig.layout.xaxis.domain[1] * (width - fig.layout.margin.l - fig.layout.margin.r) == pytest.approx(560)


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
    assert list(fig.data[0].customdata) == ["hook_embed<br>0.500 ± 0.100", "blocks.0.attn.hook_z<br>0.950 ± 0.020"]
    # an undefined spread (NaN, e.g. one seed) has no error bar and no "± 0", not a bar of 0
    one = {"hook_embed": {"mean": 0.5, "std": float("nan")}, "blocks.0.attn.hook_z": {"mean": 0.95, "std": 0.02}}
    fig = plot_adjacency_by_layer({"addition": {"trained": one}})
    assert list(fig.data[0].error_y.array) == [None, 0.02]
    assert list(fig.data[0].customdata) == ["hook_embed<br>0.500", "blocks.0.attn.hook_z<br>0.950 ± 0.020"]
    # so is a mean over one sequence (analysis results carry "n"; their std of one value is stored as 0.0)
    one = {"hook_embed": {"mean": 0.5, "std": 0.0, "n": 1}, "blocks.0.attn.hook_z": {"mean": 0.95, "std": 0.0, "n": 2}}
    fig = plot_adjacency_by_layer({"addition": {"trained": one}})
    assert list(fig.data[0].error_y.array) == [None, 0.0]
    assert list(fig.data[0].customdata) == ["hook_embed<br>0.500", "blocks.0.attn.hook_z<br>0.950 ± 0.000"]
    # the horizontal legend hangs below the title (before: anchored at its bottom above the panels, so that in a
    # narrow window its wrapped rows grew upwards over the title)
    for n_tasks in (1, 4):
        fig = plot_adjacency_by_layer({t: {"trained": one} for t in ["addition", "reversal", "indexing", "ordering"]
                                       [:n_tasks]})
        leg, title = fig.layout.legend, fig.layout.title
        assert (leg.yref, leg.yanchor, title.yref, title.yanchor) == ("container", "top", "container", "top")
        assert 30 <= (1 - leg.y) * fig.layout.height <= fig.layout.margin.t - 60


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


def test_save_figure_expands_a_tilde(tmp_path, monkeypatch):
    """Before: save_figure(fig, "~/f.html") wrote ./~/f.html (and ./~/plotly.min.js) in the current folder."""
    from nope_interp.plotting import ensure_plotlyjs, plot_cosine_heatmaps, save_figure

    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    path = save_figure(plot_cosine_heatmaps(torch.eye(3, dtype=torch.float64)[None], ["x"], "abc"), "~/figs/f.html")
    assert path == home / "figs" / "f.html" and path.is_file() and (home / "figs" / "plotly.min.js").is_file()
    assert ensure_plotlyjs("~/figs") == home / "figs" / "plotly.min.js"
    assert not list(cwd.iterdir())


def test_labels_that_are_not_strings_are_refused_in_one_line():
    """Before: tokens ["a", None, "c"] or [1, 2, 3] failed with AttributeError ('NoneType' / 'int' object has no
    attribute 'replace'); an int site (or task) key failed in short_label with AttributeError ('split'), and a
    None model label was drawn as an unnamed line."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_adjacency_by_layer, plot_cosine_heatmaps, plot_lag_profile

    eye = torch.eye(3)[None]
    for tokens, words in ((["a", None, "c"], r"got None \(NoneType\)"), ([1, 2, 3], r"got 1 \(int\)"),
                          (torch.arange(3), r"got tensor\(0\)"), (b"abc", "got bytes"), (3, "got int 3")):
        with pytest.raises(NopeInterpError, match=f"^plot_cosine_heatmaps: tokens must be .*{words}") as err:
            unhooked(plot_cosine_heatmaps)(eye, ["a"], tokens)
        assert "\n" not in str(err.value)
    with pytest.raises(NopeInterpError, match="site_labels must be strings"):
        unhooked(plot_cosine_heatmaps)(eye, 3, "abc")
    assert [t.name for t in plot_cosine_heatmaps(eye, ("a",), ("x", "y", "z")).data] == ["a"]  # tuples still fine
    assert list(unhooked(plot_cosine_heatmaps)(eye, iter(["a"]), ["x", "y", "z"]).data[0].x) == ["0:x", "1:y", "2:z"]
    ok = {"mean": 0.5, "std": 0.1}
    for bad, words in (({1: {"m": {"hook_embed": ok}}}, "task names must be strings"),
                       ({"t": {None: {"hook_embed": ok}}}, "model labels must be strings"),
                       ({"t": {"m": {3: ok}}}, "sites must be hook names")):
        with pytest.raises(NopeInterpError, match=f"^plot_adjacency_by_layer: {words}"):
            unhooked(plot_adjacency_by_layer)(bad)
    with pytest.raises(NopeInterpError, match="^plot_lag_profile: the sites of profiles must be hook names"):
        unhooked(plot_lag_profile)({3: {"lags": [1], "mean": [0.5], "std": [0.0]}}, [1.0])


def test_lag_profile_names_what_is_missing_or_wrong_in_its_dict():
    """Before: {"s": {"mean": [1]}} failed with KeyError 'lags'; a list of profiles with AttributeError; a None
    idealised curve or a string mean with TypeError; a mean of 5 was drawn above the fixed 1.05 axis top."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_lag_profile

    good = {"lags": [1, 2], "mean": [0.5, 0.2], "std": [0.1, 0.1]}
    for profiles, curve, words in (
            ({"s": {"mean": [1]}}, [1], r"profiles\['s'\] has no 'lags' or 'std'.*got keys 'mean'"),
            ({"s": {"lags": [1], "std": [0]}}, [1], r"profiles\['s'\] has no 'mean'"),
            ([good], [1, 1], "profiles must be a mapping"),
            ({"s": 3}, [1, 1], r"profiles\['s'\] must be a mapping"),
            ({"s": {**good, "mean": "ab"}}, [1, 1], r"profiles\['s'\]\['mean'\] must be a list of numbers"),
            ({"s": {**good, "std": 0.1}}, [1, 1], r"profiles\['s'\]\['std'\] must be a list of numbers"),
            ({"s": {**good, "lags": [1, None]}}, [1, 1], r"profiles\['s'\]\['lags'\] must hold finite real numbers"),
            ({"s": {**good, "mean": [5.0, 0.2]}}, [1, 1], r"profiles.*means in \[-1, 1\].*got 5.0"),
            ({"s": {**good, "std": [0.1, -1.0]}}, [1, 1], "profiles.*stds >= 0"),
            ({"s": {**good, "mean": [float("inf"), 0.2]}}, [1, 1], "profiles.*got inf"),
            ({"s": good}, None, "uniform_causal must be a list of numbers")):
        with pytest.raises(NopeInterpError, match=f"^plot_lag_profile: {words}") as err:
            unhooked(plot_lag_profile)(profiles, curve)
        assert "\n" not in str(err.value)
    # what lag_summary or a strict-JSON result file gives still draws: tensors, and None (null) for undefined
    fig = unhooked(plot_lag_profile)({"s": {"lags": torch.tensor([1, 2]), "mean": [None, 0.2], "std": [0.1, None]}},
                                     [1.0, 0.5])
    assert list(fig.data[0].x) == [1, 2]


@pytest.mark.parametrize("undefined", [float("nan"), None])
def test_lag_profile_y_range_ignores_undefined_points(undefined):
    """Before: a NaN mean made min() NaN, so the range fell back to (-0.05, 1.05) and -0.9 was drawn off the axis;
    None (a strict-JSON result file's NaN) failed with TypeError."""
    from nope_interp.plotting import plot_lag_profile

    profile = {"lags": [1, 2, 3], "mean": [undefined, -0.9, 0.5], "std": [0.0, 0.05, undefined]}
    fig = unhooked(plot_lag_profile)({"blocks.0.attn.hook_z": profile}, [1.0, 0.9, 0.8])
    low, high = fig.layout.yaxis.range
    assert low == pytest.approx(-1.0) and high == 1.05   # -0.9 - 0.05, less the margin
    everything_undefined = {"lags": [1], "mean": [math.nan], "std": [math.nan]}
    assert plot_lag_profile({"hook_embed": everything_undefined}, [1.0]).layout.yaxis.range == (-0.05, 1.05)


def test_every_line_has_its_own_colour():
    """Before: plot_adjacency_by_layer cycled 4 colours (a 5th model took the 1st's), coloured a label by its
    position in each panel (one model, two colours) and showed legend entries of the first panel only; the lag
    profile cycled 4 colours for the sites outside the blocks."""
    from nope_interp.plotting import plot_adjacency_by_layer, plot_lag_profile

    site = {"hook_embed": {"mean": 0.5, "std": 0.1}}
    for n in (5, 30):
        fig = plot_adjacency_by_layer({"t": {f"m{i}": site for i in range(n)}})
        assert len({t.line.color for t in fig.data}) == n
    fig = plot_adjacency_by_layer({"a": {"x": site, "y": site}, "b": {"y": site, "z": site}})
    by_name: dict[str, set] = {}
    for t in fig.data:
        by_name.setdefault(t.name, set()).add(t.line.color)
    assert all(len(c) == 1 for c in by_name.values()) and len(set.union(*by_name.values())) == 3
    assert sorted(t.name for t in fig.data if t.showlegend) == ["x", "y", "z"]   # z is only in the 2nd panel
    prof = {"lags": [1], "mean": [0.5], "std": [0.1]}
    outside = ["hook_embed", "hook_pos_embed", "hook_tokens", "ln_final.hook_scale", "ln_final.hook_normalized",
               "unembed.hook_in"]
    for layers in (2, 300):
        profiles = {s: prof for s in outside} | {f"blocks.{i}.attn.hook_z": prof for i in range(layers)}
        lines = [t for t in plot_lag_profile(profiles, [1.0]).data if not t.name.startswith("idealised")]
        assert len({t.line.color for t in lines}) == len(lines) == len(outside) + layers


def test_line_colours_are_distinct_past_the_palette():
    """The helper the figures (and jobs' figures) take their colours from: LINE_COLOURS first, then distinct hues."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import LINE_COLOURS, line_colours

    for n in (0, 1, 5, 24, 25, 200, 5000):
        assert len(set(line_colours(n))) == n
    assert line_colours(24) == list(LINE_COLOURS) and line_colours(3) == list(LINE_COLOURS[:3])
    for bad in (-1, 2.0, True):
        with pytest.raises(NopeInterpError, match="line_colours: n must be an integer >= 0"):
            unhooked(line_colours)(bad)


def test_the_jobs_figures_give_every_line_its_own_colour_past_the_palette():
    """Before: length-gen (sites), long-context (configurations) and trajectory (runs) cycled LINE_COLOURS, so
    the 25th line took the first one's colour. Each now takes line_colours(n); checked on their source, as the
    figures need many results to build."""
    import inspect

    from nope_interp.jobs import length_gen, long_context, trajectory

    for module in (length_gen, long_context, trajectory):
        source = inspect.getsource(module)
        assert "% len(palette)" not in source and "% len(LINE_COLOURS)" not in source, module.__name__
        assert "line_colours(" in source


def test_with_plotlyjs_lists_the_shared_file_of_each_figure_folder_once(tmp_path):
    """save_figure returns the figure only; with_plotlyjs adds the plotly.min.js it wrote beside it, once per
    folder, after the given paths (not again when listed, not for a folder whose file is not there)."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.plotting import plot_cosine_heatmaps, save_figure, with_plotlyjs

    fig = plot_cosine_heatmaps(torch.eye(3, dtype=torch.float64)[None], ["s"], "abc")
    a1, a2 = save_figure(fig, tmp_path / "a" / "1.html"), save_figure(fig, tmp_path / "a" / "2.html")
    b1 = save_figure(fig, tmp_path / "b" / "1.html")
    data = tmp_path / "r.json"
    data.write_text("{}")
    got = with_plotlyjs([data, a1, b1, str(a2)])
    assert got == [data, a1, b1, a2, tmp_path / "a" / "plotly.min.js", tmp_path / "b" / "plotly.min.js"]
    assert with_plotlyjs(got) == got  # already listed: not twice
    assert with_plotlyjs([data]) == [data] and with_plotlyjs([]) == []
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.html").write_text("<html></html>")  # not written by save_figure: no plotly.min.js there
    assert with_plotlyjs([tmp_path / "c" / "x.html"]) == [tmp_path / "c" / "x.html"]
    with pytest.raises(NopeInterpError, match="single path"):
        with_plotlyjs(str(a1))


@pytest.mark.parametrize("width", [1620, 760, 500, None])
def test_saved_figures_follow_the_window_up_to_their_drawn_width(tmp_path, width):
    """Before: a figure drawn 1,100-1,620 pixels wide was written at that fixed width and scrolled sideways in a
    smaller window (panels and markers at the right edge hidden); now the page shrinks it to the window, never
    wider than drawn, and the figure object itself keeps its width."""
    import json
    import re

    import plotly.graph_objects as go

    from nope_interp.plotting import save_figure

    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))
    fig.update_layout(width=width, height=400, title="t")
    html = save_figure(fig, tmp_path / "f.html").read_text()
    assert fig.layout.width == width
    assert not re.search(r"width:\s*\d+px;\">", html.replace("max-width", "").replace("min-width", ""))
    layout = json.loads(re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*(\{.*?\}),\s*\{', html, re.S)
                        .group(2))
    assert "width" not in layout and layout["autosize"] is True and layout["height"] == 400
    assert '"responsive": true' in html
    block = re.search(r'class="nope-interp-figure" style="([^"]*)"', html).group(1)
    if width is None:
        assert "max-width" not in block and "min-width: 640px" in block
    else:
        assert f"max-width: {width}px" in block and f"min-width: {min(width, max(640, round(0.7 * width)))}px" in block
        assert {1620: 1134, 760: 640, 500: 500}[width] == min(width, max(640, round(0.7 * width)))


def test_slider_labels_split_dotted_and_underscored_names_and_never_come_out_empty():
    """Before: ln_final.hook_normalized gave 'ln<br>final.hook<br>normalized' and '___' an empty label."""
    from nope_interp.plotting import _step_label

    assert _step_label("ln_final.hook_normalized") == "ln<br>final<br>hook<br>normalized"
    assert _step_label("blocks.0.hook_resid_post") == "L0<br>resid<br>post"
    assert _step_label("model.layers.0.self_attn.o_proj").count("<br>") >= 5
    assert _step_label("___") == "___"
