"""Plotly figures (return ``go.Figure``; never show) and the one helper that writes offline HTML.

Cosine heatmaps use the diverging ``RdBu`` scale fixed to [-1, 1] with midpoint 0, so 0 is white and
the sign of a cosine reads at a glance.
"""

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from plotly.colors import qualitative
from plotly.subplots import make_subplots
from torch import Tensor

from nope_interp.checks import in_order, is_int, is_real
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import short_label
from nope_interp.similarity import check_tensor

short_site_label = short_label  # the name used before hooks.py owned it

#: Colours of lines that stand for models, runs or sites: plotly's 24 distinct "Dark24" colours. Take them with
#: :func:`line_colours`, which goes on with distinct hues past 24 lines, so no two lines of a figure share a
#: colour (indexing this tuple modulo its length makes the 25th line repeat the 1st).
LINE_COLOURS: tuple[str, ...] = tuple(qualitative.Dark24)

_SCALE = "RdBu_r"


def line_colours(n: int) -> list[str]:
    """``n`` distinct line colours: the first ``n`` of :data:`LINE_COLOURS` for ``n`` <= 24, else ``n`` hues evenly
    spaced around the colour wheel (CSS ``hsl``, alternately darker and lighter so neighbours differ).

    Raises:
        NopeInterpError: ``n`` not an integer >= 0.
    """
    if not is_int(n) or n < 0:
        raise NopeInterpError(f"line_colours: n must be an integer >= 0, got {n!r}"[:200])
    n = int(n)
    if n <= len(LINE_COLOURS):
        return list(LINE_COLOURS[:n])
    return [f"hsl({360 * k / n:.4f}, 75%, {40 if k % 2 else 55}%)" for k in range(n)]


def html_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A titled HTML table (every cell escaped) for a result's ``_repr_html_`` in Jupyter: ``header`` names the
    columns, each row of ``rows`` gives one string per column. Raises nothing (a short row draws short)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<b>{html.escape(title)}</b><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def line_mode(n_points: int) -> str:
    """Plotly ``mode`` for a data-dependent line of ``n_points`` points: ``"lines"``, or ``"markers"`` for a
    single point (a one-point line draws nothing: a one-rank ablation curve, a one-layer probe, one evaluation
    in a run stopped early, a lag profile of one lag)."""
    return "lines" if n_points > 1 else "markers"


def _axis_labels(tokens: Sequence[str]) -> list[str]:
    # one label per position; repeated characters stay distinct because of the index prefix
    return [f"{i}:{t.replace(chr(10), '␤')}" for i, t in enumerate(tokens)]


def _labels(values: object, name: str, fn: str, what: str) -> list[str]:
    """``values`` (a string: its characters; or an iterable of strings) as a list of strings, else one line."""
    if isinstance(values, str):
        return list(values)
    if isinstance(values, (bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
        raise NopeInterpError(f"{fn}: {name} must be {what}, got {type(values).__name__} {values!r}"[:300])
    out = in_order(name, values, "labels", fn)  # a set would draw the labels in no order
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise NopeInterpError(f"{fn}: {name} must be {what}, got {bad[0]!r} ({type(bad[0]).__name__}) among "
                              f"them; convert them first (e.g. [str(t) for t in {name}])"[:300])
    return out


#: The slider of :func:`plot_cosine_heatmaps`: its label font size, and the pixels a character of a label takes at
#: that size in the widest of plotly's default fonts (Verdana; "resid_post" is 46 px in Open Sans).
_STEP_FONT_SIZE = 10
_STEP_CHAR_PX = 6.2
#: plotly.js's slider geometry: the padding it wants beside each label, the inset of the first and last steps.
_STEP_LABEL_PAD = 8
_STEP_INSET = 10
#: Figure width of :func:`plot_cosine_heatmaps` (and its least), the widest it grows to give every slider step
#: room for its label, the heatmap's width in pixels, and the left and right margins.
_COSINE_WIDTH, _COSINE_MAX_WIDTH, _COSINE_HEATMAP_PX, _COSINE_MARGIN = 760, 1600, 560, 80


def _step_label(site: str) -> str:
    """A slider step's label: the site's :func:`~nope_interp.hooks.short_label` a word per line, words split at
    ``_`` and ``.`` too (``blocks.0.hook_resid_post`` -> ``L0<br>resid<br>post``, ``ln_final.hook_normalized`` ->
    ``ln<br>final<br>hook<br>normalized``), narrow enough for a step of its own; the site itself when it has no
    word."""
    return "<br>".join(word for word in re.split(r"[\s_.]+", short_label(site)) if word) or site


def _step_width(labels: Sequence[str]) -> float:
    """Pixels between two slider steps that plotly needs to draw every one of ``labels`` (it draws only every
    k-th label when the widest does not fit, its ``labelStride``)."""
    widest = max(len(line) for label in labels for line in label.split("<br>"))
    return _STEP_CHAR_PX * widest + _STEP_LABEL_PAD


def plot_cosine_heatmaps(
    sim: Float[Tensor, "site pos pos"], site_labels: Sequence[str], tokens: str | Sequence[str], title: str = ""
) -> go.Figure:
    """Interactive cosine-similarity heatmaps, one per hook site, chosen with a slider.

    Every step of the slider is labelled with the site's short label a word per line (``L0<br>resid<br>post``;
    the title names the site in full): the figure grows wider than 760 pixels as the sites need, up to 1600,
    where 37 sites of the analysis points fit (a 9-layer model; 1116 pixels for 25), but 21 with words of 10
    letters (``ln1.hook_normalized``); past that plotly labels every second step or fewer. The heatmap keeps its
    size.

    Args:
        sim: cosine matrices of one prompt at each site, values in [-1, 1].
        site_labels: a name per site (e.g. TransformerLens hook names).
        tokens: the prompt's characters (one per position) for both axes, or one label per position (a
            sequence of strings, e.g. ``[""] * pos`` for position numbers alone; token ids must be made strings
            first: ``[str(t) for t in ids]``).
        title: figure title.

    Raises:
        NopeInterpError: ``sim`` not a real float tensor ``(site, pos, pos)`` of square matrices with at least
            one site, or with a value outside [-1, 1] (NaN is allowed: the cosine of a zero vector); ``site_labels``
            is a single string, not a sequence, or holds a label that is not a string; ``tokens`` is None, not a
            string or sequence, or holds a label that is not a string (None, an int); ``site_labels`` or ``tokens``
            a set or frozenset (their order is the sites' and positions' order:
            :func:`~nope_interp.checks.in_order`); the number of labels or characters does not match ``sim``.
    """
    check_tensor(sim, "sim", "(site, pos, pos)", ndim=3, min_sizes={0: 1, 1: 1}, fn="plot_cosine_heatmaps")
    if sim.shape[1] != sim.shape[2]:
        raise NopeInterpError(f"plot_cosine_heatmaps: sim must hold square matrices, got shape {tuple(sim.shape)}")
    sim = sim.detach()
    finite = sim[torch.isfinite(sim)]
    if bool(torch.isinf(sim).any()) or (finite.numel() and float(finite.abs().max()) > 1 + 1e-6):
        raise NopeInterpError("plot_cosine_heatmaps: sim must hold cosines in [-1, 1] (or NaN), got values up to "
                              f"{float(sim.abs().nan_to_num(0).max()):.3g} in absolute value")
    if tokens is None:
        raise NopeInterpError("plot_cosine_heatmaps: tokens must be the prompt's characters or one label per "
                              "position, got None")
    if isinstance(site_labels, (str, bytes)):
        raise NopeInterpError(f"site_labels must be a sequence of labels, one per site, got the single string "
                              f"{site_labels!r}")
    if isinstance(site_labels, Iterable):  # a set would put the labels on the wrong sites
        site_labels = in_order("site_labels", site_labels, "site labels", "plot_cosine_heatmaps")
    if not isinstance(site_labels, list) or any(not isinstance(label, str) for label in site_labels):
        raise NopeInterpError(f"plot_cosine_heatmaps: site_labels must be strings, got {site_labels!r}"[:300])
    tokens = _labels(tokens, "tokens", "plot_cosine_heatmaps", "the prompt's characters (a string) or one label "
                     "(a string) per position")
    if len(site_labels) != sim.shape[0] or len(tokens) != sim.shape[-1]:
        raise NopeInterpError(
            f"got {len(site_labels)} site labels and {len(tokens)} characters for matrices of shape {tuple(sim.shape)}"
        )
    axis = _axis_labels(tokens)
    fig = go.Figure()
    for s, label in enumerate(site_labels):
        fig.add_trace(go.Heatmap(
            z=sim[s].cpu().double().numpy(), x=axis, y=axis, zmin=-1, zmax=1, zmid=0, colorscale=_SCALE,
            visible=(s == 0), name=label, colorbar={"title": "cosine"},
            hovertemplate="pos i %{y}<br>pos j %{x}<br>cos %{z:.3f}<extra>" + label + "</extra>",
        ))
    steps = [
        {"method": "update", "label": _step_label(label), "value": label,
         "args": [{"visible": [i == s for i in range(len(site_labels))]}, {"title.text": f"{title}<br>{label}"}]}
        for s, label in enumerate(site_labels)
    ]
    # wide enough that every step has room for its label (before: the full hook names, of which plotly drew every
    # third at 9 sites and every tenth at 31); the heatmap keeps its width, the colorbar beside it
    slider_px = 2 * _STEP_INSET + (len(steps) - 1) * _step_width([step["label"] for step in steps])
    width = int(min(_COSINE_MAX_WIDTH, max(_COSINE_WIDTH, math.ceil(slider_px) + 2 * _COSINE_MARGIN)))
    heatmap = _COSINE_HEATMAP_PX / (width - 2 * _COSINE_MARGIN)
    fig.update_traces(colorbar={"x": heatmap + 0.02, "xanchor": "left"})
    fig.update_layout(
        title={"text": f"{title}<br>{site_labels[0]}"},
        sliders=[{"active": 0, "steps": steps, "currentvalue": {"visible": False}, "pad": {"t": 60},
                  "font": {"size": _STEP_FONT_SIZE}}],
        xaxis={"title": "pos j (column)", "tickangle": 0, "domain": [0, heatmap], "constrain": "domain",
               "constraintoward": "left"},
        # square cells: a wide figure shown narrower than drawn (the page follows the window) shrinks the heatmap
        # whole, not its width alone
        yaxis={"title": "pos i (row)", "autorange": "reversed", "scaleanchor": "x", "constrain": "domain"},
        width=width, height=820, margin={"l": _COSINE_MARGIN, "r": _COSINE_MARGIN},
    )
    return fig


def add_chance_line(fig: go.Figure, **where: Any) -> None:
    """The adjacency score's chance level (0.5: random order, ``docs/method.md``), dotted grey and labelled
    ``chance``, in the panels ``where`` selects (``row``, ``col`` of a subplot grid; every panel by default)."""
    fig.add_hline(y=0.5, line_dash="dot", line_color="gray", annotation_text="chance",
                  annotation_position="bottom right", annotation_font={"color": "gray", "size": 10}, **where)


def plot_adjacency_by_layer(
    results: Mapping[str, Mapping[str, Mapping[str, Mapping[str, float]]]], title: str = "Adjacency score by layer"
) -> go.Figure:
    """Adjacency score (mean +- std over sequences) by hook site: one panel per task, a line per model.

    Args:
        results: ``results[task][model_label][site] = {"mean": m, "std": s}``, e.g. model labels
            ``"initialised"`` and ``"trained"``; sites in forward order. An optional ``"n"`` (the sequences
            averaged, as analysis results carry it) of 1, or a NaN std, draws the point without an error bar
            and its hover text without ``±``: the spread of one value is undefined.
        title: figure title.

    Raises:
        NopeInterpError: no task; ``results`` not nested mappings of that form (a missing ``"mean"`` or
            ``"std"`` included); a task name, model label or site that is not a string; a mean outside [0, 1] (an
            adjacency score: it would be drawn off the fixed axis, unseen) or a std that is negative; an infinite
            value (NaN, undefined, is drawn as a gap).

    Each model label has one colour in every panel (:func:`line_colours`: distinct for any number of labels) and
    one legend entry.
    """
    if not isinstance(results, Mapping):
        raise NopeInterpError(f"plot_adjacency_by_layer: results must be a mapping task -> model -> site -> "
                              f"{{'mean', 'std'}}, got {type(results).__name__}")
    task_names = list(results)
    if not task_names:
        raise NopeInterpError("plot_adjacency_by_layer needs at least one task")
    for task, models in results.items():
        if not isinstance(task, str):
            raise NopeInterpError(f"plot_adjacency_by_layer: task names must be strings, got {task!r}"[:300])
        if not isinstance(models, Mapping):
            raise NopeInterpError(f"plot_adjacency_by_layer: results[{task!r}] must map model labels to sites, "
                                  f"got {type(models).__name__}")
        for label, sites in models.items():
            if not isinstance(label, str):
                raise NopeInterpError(f"plot_adjacency_by_layer: model labels must be strings, got {label!r} in "
                                      f"results[{task!r}]"[:300])
            if not isinstance(sites, Mapping):
                raise NopeInterpError(f"plot_adjacency_by_layer: results[{task!r}][{label!r}] must map sites to "
                                      f"{{'mean', 'std'}}, got {type(sites).__name__}")
            for site, v in sites.items():
                where = f"results[{task!r}][{label!r}][{site!r}]"
                if not isinstance(site, str):
                    raise NopeInterpError(f"plot_adjacency_by_layer: sites must be hook names (strings), got "
                                          f"{site!r} in results[{task!r}][{label!r}]"[:300])
                if not isinstance(v, Mapping) or "mean" not in v or "std" not in v:
                    raise NopeInterpError(f"plot_adjacency_by_layer: {where} must have 'mean' and 'std', got {v!r}")
                mean, std = v["mean"], v["std"]
                ok = all(is_real(x) and not math.isinf(x) for x in (mean, std))   # NaN (undefined) is drawn as a gap
                if not ok or not (math.isnan(mean) or 0.0 <= mean <= 1.0) or std < 0:
                    raise NopeInterpError(f"plot_adjacency_by_layer: {where} must have a mean in [0, 1] (an "
                                          f"adjacency score) and a std >= 0 (NaN: undefined), got mean={mean!r}, "
                                          f"std={std!r}")
    fig = make_subplots(rows=len(task_names), cols=1, subplot_titles=task_names, shared_xaxes=False,
                        vertical_spacing=0.45 / max(2, len(task_names)))
    model_labels = list(dict.fromkeys(label for models in results.values() for label in models))
    colour = dict(zip(model_labels, line_colours(len(model_labels)), strict=True))  # one per label, every panel
    shown: set[str] = set()
    for r, task in enumerate(task_names, start=1):
        for model_label, sites in results[task].items():
            names = list(sites)
            # NaN std, or a mean of one sequence ("n": 1): the spread is undefined, no bar (not a bar of 0)
            stds = [None if math.isnan(sites[s]["std"]) or sites[s].get("n") == 1 else sites[s]["std"] for s in names]
            hover = [f"{s}<br>{sites[s]['mean']:.3f}" + ("" if sd is None else f" ± {sd:.3f}")
                     for s, sd in zip(names, stds, strict=True)]
            fig.add_trace(go.Scatter(
                x=[short_label(s) for s in names], y=[sites[s]["mean"] for s in names], mode="lines+markers",
                customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                error_y={"type": "data", "array": stds, "visible": True},
                name=model_label, legendgroup=model_label, showlegend=model_label not in shown,
                line={"color": colour[model_label]},
            ), row=r, col=1)
            shown.add(model_label)
        add_chance_line(fig, row=r, col=1)
        fig.update_yaxes(title_text="adjacency score", range=[0, 1.05], row=r, col=1)
    fig.update_xaxes(tickangle=-60, tickfont={"size": 10})
    height = 160 + 300 * len(task_names)
    # the legend hangs from a fixed distance below the title (container coordinates), so that in a narrow window
    # its rows wrap downwards into the top margin instead of upwards over the title
    fig.update_layout(title={"text": title, "yref": "container", "y": 1, "yanchor": "top", "pad": {"t": 14}},
                      height=height, width=1100, margin={"t": 140},
                      legend={"orientation": "h", "yref": "container", "yanchor": "top", "y": 1 - 52 / height,
                              "x": 0})
    return fig


def plot_lag_profile(
    profiles: Mapping[str, Mapping[str, Any]], uniform_causal: Sequence[float],
    title: str = "Lag profile", window: int | None = None, n_pos: int | None = None,
) -> go.Figure:
    """Lag profile by site: mean cosine c(d) between positions d apart (mean ± std over sequences).

    One panel per kind of site (``embed``, ``resid_pre``, ``z``, ...), one line per layer in it, coloured
    from the first layer (light) to the last (dark); a legend entry per layer toggles it in every panel.
    The idealised curve of uniform causal averaging of i.i.d. inputs is drawn dashed black in each panel
    (and the sliding-window one dotted grey when ``window`` is given).

    Args:
        profiles: ``profiles[site] = {"lags": [1..D], "mean": [...], "std": [...]}``
            (:func:`~nope_interp.similarity.lag_summary`); full hook names in forward order; cosines in [-1, 1].
            An optional ``"n"`` (sequences averaged, as :func:`~nope_interp.similarity.lag_summary` gives it) of 1
            draws that site without error bars: the spread of one value is undefined.
        uniform_causal: the idealised c(d), d = 1..D (:func:`~nope_interp.similarity.uniform_causal_lag_profile`).
        title: figure title.
        window: also draw the idealised sliding-window curve of this width (keys per query), when given.
        n_pos: positions per sequence the profiles were measured on (``pos``); needed with ``window``, whose
            curve depends on the sequence length, not only on the lags drawn (D may be below pos - 1).

    A NaN or None (JSON's null) in a site's ``mean`` or ``std`` means undefined: drawn as a gap, and left out
    of the y-range (which is set from the finite values only). Every line has its own colour (a layer's is the
    same in every panel): the layers in Viridis, the sites outside the blocks in warm colours.

    Raises:
        NopeInterpError: no site; ``profiles`` not a mapping of hook names (strings) to mappings; a site without
            ``"lags"``, ``"mean"`` or ``"std"`` (the message names the key); one of them not a sequence of numbers;
            a lag that is not finite; a mean outside [-1, 1] or a negative std (NaN / None: undefined); a site's
            lags or the idealised curve of another length than the first site's, or a non-finite idealised value;
            ``window`` without ``n_pos``, or ``n_pos`` not an integer above the largest lag.
    """
    import math
    import re

    import plotly.colors

    from nope_interp.similarity import sliding_window_lag_profile

    if not isinstance(profiles, Mapping):
        raise NopeInterpError(f"plot_lag_profile: profiles must be a mapping site -> {{'lags', 'mean', 'std'}}, got "
                              f"{type(profiles).__name__}")
    if not profiles:
        raise NopeInterpError("plot_lag_profile needs at least one site")
    curves = {site: _lag_curves(site, p) for site, p in profiles.items()}
    lags = curves[next(iter(curves))]["lags"]
    for site, p in curves.items():
        if len(p["lags"]) != len(lags) or len(p["mean"]) != len(lags) or len(p["std"]) != len(lags):
            raise NopeInterpError(f"site {site!r} has {len(p['mean'])} lags, the first site {len(lags)}")
    uniform_causal = _numbers(uniform_causal, "plot_lag_profile: uniform_causal", undefined=False)
    if len(uniform_causal) != len(lags):
        raise NopeInterpError(f"the idealised curve has {len(uniform_causal)} lags for profiles of {len(lags)}")
    groups: dict[str, list[tuple[str, str]]] = {}  # kind -> [(layer label, site)]
    for site in profiles:
        m = re.fullmatch(r"(L\d+) (.+)", short_label(site))
        layer, kind = (m.group(1), m.group(2)) if m else (short_label(site), short_label(site))
        groups.setdefault(kind, []).append((layer, site))
    layers = list(dict.fromkeys(layer for g in groups.values() for layer, _ in g))
    numbered = [la for la in layers if re.fullmatch(r"L\d+", la)]
    fractions = [k / max(1, len(numbered) - 1) for k in range(len(numbered))]
    shades = plotly.colors.sample_colorscale("Viridis", [0.85 * (1 - f) for f in fractions])
    if len(set(shades)) < len(shades):  # hundreds of layers: Viridis's integer rgb repeats; cool hues instead
        shades = [f"hsl({60 + 220 * f:.4f}, 70%, {65 - 35 * f:.4f}%)" for f in fractions]
    color = dict(zip(numbered, shades, strict=True))
    rest = [la for la in layers if la not in color]  # sites outside the blocks (embed, ...): warm colours
    warm = ["#ff7f0e", "#d62728", "#8c564b", "#e377c2"][:len(rest)] if len(rest) <= 4 else \
        [f"hsl({(320 + 80 * k / len(rest)) % 360:.4f}, 85%, {40 if k % 2 else 60}%)" for k in range(len(rest))]
    color |= dict(zip(rest, warm, strict=True))
    cols = min(3, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=list(groups), shared_yaxes=True,
                        horizontal_spacing=0.04, vertical_spacing=0.16 / max(1, rows - 1) + 0.06)
    if window is not None and n_pos is None:
        raise NopeInterpError("plot_lag_profile: window needs n_pos (positions per sequence): the sliding-window "
                              "curve depends on the sequence length, not only on the lags drawn")
    if n_pos is not None and (not is_int(n_pos) or n_pos <= len(lags)):
        raise NopeInterpError(f"plot_lag_profile: n_pos must be an integer above the largest lag {len(lags)}, "
                              f"got {n_pos!r}")
    # ints for sliding_window_lag_profile (its checks take Python ints only)
    n_pos, window = (int(v) if is_int(v) else v for v in (n_pos, window))
    sw = sliding_window_lag_profile(n_pos, window, len(lags)).tolist() if window is not None else None
    shown: set[str] = set()
    for g, members in enumerate(groups.values()):
        r, c = g // cols + 1, g % cols + 1
        for layer, site in members:
            p = curves[site]
            # a mean over one sequence ("n": 1) or a NaN std: the spread is undefined, no bar and no "±"
            one = profiles[site].get("n") == 1
            stds = [None if one or sd is None or math.isnan(sd) else sd for sd in p["std"]]
            hover = [f"{site}<br>lag {d}: {m:.3f}" + ("" if sd is None else f" ± {sd:.3f}")
                     for d, m, sd in zip(lags, p["mean"], stds, strict=True)]
            fig.add_trace(go.Scatter(
                x=lags, y=list(p["mean"]), mode="lines+markers", name=layer, legendgroup=layer,
                showlegend=layer not in shown, customdata=hover,
                line={"color": color[layer], "width": 1.5}, marker={"size": 4},
                hovertemplate="%{customdata}<extra></extra>",
                error_y={"type": "data", "array": stds, "visible": True, "thickness": 0.8, "width": 2},
            ), row=r, col=c)
            shown.add(layer)
        fig.add_trace(go.Scatter(x=lags, y=list(uniform_causal), mode=line_mode(len(lags)),
                                 name="idealised: uniform causal",
                                 legendgroup="uniform", showlegend=g == 0,
                                 line={"color": "black", "width": 2.5, "dash": "dash"},
                                 hovertemplate="uniform causal<br>lag %{x}: %{y:.3f}<extra></extra>"), row=r, col=c)
        if sw is not None:
            fig.add_trace(go.Scatter(x=lags, y=sw, mode=line_mode(len(lags)),
                                     name=f"idealised: sliding window {window}",
                                     legendgroup="window", showlegend=g == 0,
                                     line={"color": "gray", "width": 2.5, "dash": "dot"}), row=r, col=c)
        fig.add_hline(y=0, line_color="lightgray", row=r, col=c)
        fig.update_xaxes(title_text="lag d" if r == rows else None, row=r, col=c)
    # NaN-aware: an undefined point (NaN) would make min() NaN and the range the default, hiding points below 0
    bottoms = np.concatenate([np.asarray(p["mean"]) - np.nan_to_num(np.asarray(p["std"]), nan=0.0)
                              for p in curves.values()])
    low = min(0.0, float(np.nanmin(bottoms))) if np.isfinite(bottoms).any() else 0.0
    fig.update_yaxes(range=[max(-1.05, low - 0.05), 1.05])
    for r in range(1, rows + 1):
        fig.update_yaxes(title_text="c(d) = mean cos(x_i, x_i-d)", row=r, col=1)
    fig.update_layout(title=title, width=1150, height=140 + 330 * rows, legend={"title": "layer (light = early)"},
                      margin={"t": 110})
    return fig


def _numbers(values: object, where: str, undefined: bool = True) -> list[float]:
    """``values`` (a list, tuple, array or tensor of real numbers) as floats; None -> NaN when ``undefined``;
    NaN refused when not, and infinities always."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().tolist()
    elif isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise NopeInterpError(f"{where} must be a list of numbers, got {type(values).__name__} {values!r}"[:300])
    out = []
    for v in values:
        if v is None and undefined:
            out.append(math.nan)
        elif not is_real(v) or math.isinf(v) \
                or (math.isnan(v) and not undefined):
            allowed = "real numbers (NaN or None: undefined)" if undefined else "finite real numbers"
            raise NopeInterpError(f"{where} must hold {allowed}, got {v!r}"[:300])
        else:
            out.append(float(v))
    return out


def _lag_curves(site: object, p: object) -> dict[str, list[Any]]:
    """One site's ``{"lags", "mean", "std"}`` of :func:`plot_lag_profile`, checked, as lists of floats."""
    if not isinstance(site, str):
        raise NopeInterpError(f"plot_lag_profile: the sites of profiles must be hook names (strings), got {site!r}"
                              [:300])
    if not isinstance(p, Mapping):
        raise NopeInterpError(f"plot_lag_profile: profiles[{site!r}] must be a mapping with 'lags', 'mean' and 'std' "
                              f"(similarity.lag_summary), got {type(p).__name__}")
    missing = [k for k in ("lags", "mean", "std") if k not in p]
    if missing:
        raise NopeInterpError(f"plot_lag_profile: profiles[{site!r}] has no {' or '.join(map(repr, missing))}; each "
                              f"site needs 'lags', 'mean' and 'std' (similarity.lag_summary), got keys "
                              f"{', '.join(map(repr, p)) or 'none'}"[:300])
    out = {"lags": _numbers(p["lags"], f"plot_lag_profile: profiles[{site!r}]['lags']", undefined=False),
           "mean": _numbers(p["mean"], f"plot_lag_profile: profiles[{site!r}]['mean']"),
           "std": _numbers(p["std"], f"plot_lag_profile: profiles[{site!r}]['std']")}
    out["lags"] = [int(v) if v.is_integer() else v for v in out["lags"]]  # 1, 2, ... as given, not 1.0, 2.0
    bad = [v for v in out["mean"] if abs(v) > 1 + 1e-6] + [v for v in out["std"] if v < 0]
    if bad:
        raise NopeInterpError(f"plot_lag_profile: profiles[{site!r}] must have means in [-1, 1] (cosines) and stds "
                              f">= 0 (NaN or None: undefined), got {bad[0]!r}")
    return out


#: ``(path, size, mtime_ns)`` of the ``plotly.min.js`` files this process has checked or written.
_PLOTLYJS_OK: set[tuple[str, int, int]] = set()


def ensure_plotlyjs(folder: str | Path) -> Path:
    """Make ``folder/plotly.min.js`` exactly the plotly.js bundled with the installed ``plotly`` package.

    The figures load this file by name, so a file already there from another plotly version, an empty
    or truncated one, or anything else would make them render empty or wrong: any file whose bytes differ
    is replaced (atomically); an identical one is left untouched. Checked once per file and process.

    Returns:
        The path of ``plotly.min.js``.

    Raises:
        NopeInterpError: the file cannot be written (for example a folder of that name, a read-only folder).
    """
    from plotly.offline import get_plotlyjs

    from nope_interp.io import _atomic, user_path

    js = user_path(folder) / "plotly.min.js"

    def stamp() -> tuple[str, int, int] | None:
        try:
            st = js.stat()
        except OSError:
            return None
        return (str(js.resolve()), st.st_size, st.st_mtime_ns)

    if stamp() in _PLOTLYJS_OK:
        return js
    want = get_plotlyjs().encode("utf-8")
    try:
        same = js.is_file() and not js.is_symlink() and js.stat().st_size == len(want) and js.read_bytes() == want
    except OSError:
        same = False
    if not same:
        _atomic(js, lambda tmp: Path(tmp).write_bytes(want))
    if (now := stamp()) is not None:
        _PLOTLYJS_OK.add(now)
    return js


def save_figure(fig: go.Figure, path: str | Path) -> Path:
    """Write ``fig`` as HTML that opens offline: plotly.js is written once, beside the file.

    Uses Plotly's ``include_plotlyjs="directory"``: the page loads ``plotly.min.js`` from its own folder,
    so no internet is needed and each figure stays small. That file is written by :func:`ensure_plotlyjs`
    (the installed plotly's own version; a stale, empty or foreign file already there is replaced). Atomic.

    ``path`` may start with ``~`` (the home folder; :func:`nope_interp.io.user_path`). Returns the path written.

    Raises:
        NopeInterpError: ``fig`` not a plotly Figure; ``path`` not a path or not ending in ``.html``; the
            folder or a file cannot be written; ``~`` in ``path`` cannot be expanded.
    """
    from nope_interp.io import as_path, atomic_write_text

    if not isinstance(fig, go.Figure):
        raise NopeInterpError(f"save_figure needs a plotly Figure, got {type(fig).__name__}")
    path = as_path(path, "path")
    if path.suffix != ".html":
        raise NopeInterpError(f"figures are written as .html, got {path.name!r}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise NopeInterpError(f"cannot create the figure folder {path.parent}: {err.strerror or err}") from None
    ensure_plotlyjs(path.parent)
    atomic_write_text(path, figure_page(fig))
    return path


# a figure shrinks with the window down to this many pixels, or to this share of its drawn width if more, and
# scrolls below that: further down, the panels' titles and labels of the wide multi-panel figures overlap
_MIN_PAGE_WIDTH = 640
_MIN_WIDTH_SHARE = 0.7


def figure_page(fig: go.Figure) -> str:
    """The offline HTML page :func:`save_figure` writes: ``fig`` follows the window's width, up to its own.

    A figure drawn with a fixed ``layout.width`` (the plotting functions set one that suits their panels) is
    written without it, in a block whose maximum width is that width and whose minimum is 70% of it or 640
    pixels, whichever is more (the drawn width, if smaller), with Plotly's ``responsive`` option: in a window
    narrower than the figure it shrinks to the window instead of scrolling sideways (which hid panels and markers
    at the right edge), and in a wider one it keeps the drawn width; below 70% a wide figure scrolls, since its
    panels' titles would overlap. A figure without a fixed width takes the window's width. The height is the
    figure's own. ``fig`` itself is not changed (in Jupyter it shows at its drawn size). plotly.js is loaded from
    the page's folder (``include_plotlyjs="directory"``).

    Raises:
        NopeInterpError: ``fig`` not a plotly Figure.
    """
    if not isinstance(fig, go.Figure):
        raise NopeInterpError(f"figure_page needs a plotly Figure, got {type(fig).__name__}")
    width = fig.layout.width
    page = go.Figure(fig)
    page.update_layout(width=None, autosize=True)
    body = page.to_html(include_plotlyjs="directory", full_html=False, default_width="100%",
                        config={"responsive": True})
    if width:
        w = int(math.ceil(width))
        style = f"max-width: {w}px; min-width: {min(w, max(_MIN_PAGE_WIDTH, round(_MIN_WIDTH_SHARE * w)))}px;"
    else:
        style = f"min-width: {_MIN_PAGE_WIDTH}px;"
    return ('<html>\n<head><meta charset="utf-8" /></head>\n<body>\n'
            f'<div class="nope-interp-figure" style="{style}">\n{body}\n</div>\n</body>\n</html>\n')


def with_plotlyjs(paths: Iterable[str | Path]) -> list[Path]:
    """The paths a job wrote, followed by the ``plotly.min.js`` that :func:`save_figure` wrote beside its figures.

    :func:`save_figure` returns the figure's path only, but also writes (or checks) ``plotly.min.js`` in the
    figure's folder; a job's ``write`` passes its paths through this helper so that what it returns (and the
    CLI prints under ``outputs:``) lists every file it wrote. The shared file is added once per folder that
    holds an ``.html`` path (in the order of each folder's first figure), after all of ``paths``, and only when
    it exists and ``paths`` does not already list it.

    Args:
        paths: the files written, in order (str or Path).

    Returns:
        ``paths`` as ``Path`` objects, then the ``plotly.min.js`` files not already among them.

    Raises:
        NopeInterpError: ``paths`` is a single path (a str or Path) rather than a collection of them.
    """
    if isinstance(paths, (str, Path)):
        raise NopeInterpError(f"with_plotlyjs needs a list of paths, got the single path {paths!r}")
    out = [Path(p) for p in paths]
    listed = set(out)
    for folder in dict.fromkeys(p.parent for p in out if p.suffix == ".html"):
        js = folder / "plotly.min.js"
        if js not in listed and js.is_file():
            out.append(js)
            listed.add(js)
    return out
