"""``nope-interp probe``: position probes for initialised and trained models on every task.

Writes ``results/probe/probe.json`` and ``probe.csv`` (one row per model, task, site, feature, probe and
seed, with both chance baselines) and ``figures/probe/nrmse_by_site.html`` (NRMSE by site for each
feature, the chance line at 1.0 and the shuffled-target baseline).
"""

import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.activations import collect_activations
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name
from nope_interp.io import to_csv
from nope_interp.plotting import save_figure, short_site_label
from nope_interp.probing import FEATURES, PROBES, probe_sites


def default_sites(n_layers: int) -> list[str]:
    """``hook_embed``, then ``attn.hook_z`` and ``hook_resid_post`` of the first and the last layer."""
    sites = ["hook_embed", hook_name("z", 0), hook_name("resid_post", 0)]
    if n_layers > 1:
        sites += [hook_name("z", n_layers - 1), hook_name("resid_post", n_layers - 1)]
    return sites


def probe_model(
    model: HookedTransformer, task: tasks_pkg.Task, n_prompts: int, sites: Sequence[str] | None,
    features: Sequence[str], probes: Sequence[str], seeds: Sequence[int], exclude: frozenset[str] = frozenset(),
) -> list[dict[str, Any]]:
    """Probe rows (see :func:`nope_interp.probing.probe_sites`) for one model on one task."""
    sites = list(sites or default_sites(model.cfg.n_layers))
    acts = collect_activations(model, task.prompt_tokens(task.analysis_prompts(n_prompts, 1, exclude)))
    missing = [s for s in sites if s not in acts.labels]
    if missing:
        raise NopeInterpError(f"unknown site(s) {missing}; allowed: {', '.join(acts.labels)}")
    idx = [acts.labels.index(s) for s in sites]
    return probe_sites(acts.acts[idx], sites, features, probes, seeds)


def plot_probe_nrmse(rows: list[dict[str, Any]], probe: str = "mlp") -> go.Figure:
    """NRMSE (mean over seeds) by site, a line per feature, a panel per (task, model); chance = 1.0."""
    panels: dict[tuple[str, str], dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    shuffled: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["probe"] != probe:
            continue
        key = (r["task"], r["model"])
        panels[key][r["feature"]].setdefault(r["site"], []).append(r["probe_nrmse"])
        shuffled[key][r["site"]].append(r["shuffled_baseline_nrmse"])
    if not panels:
        raise NopeInterpError(f"no rows for probe {probe!r}")
    keys = sorted(panels)
    fig = make_subplots(rows=len(keys), cols=1, subplot_titles=[f"{t}, {m}" for t, m in keys],
                        vertical_spacing=0.4 / max(2, len(keys)))
    colors = dict(zip(FEATURES, ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#7f7f7f", "#9467bd"], strict=True))
    for i, key in enumerate(keys, start=1):
        for feature, by_site in panels[key].items():
            sites = list(by_site)
            fig.add_trace(go.Scatter(x=[short_site_label(s) for s in sites],
                                     y=[sum(v) / len(v) for v in by_site.values()], mode="lines+markers",
                                     name=feature, legendgroup=feature, showlegend=(i == 1),
                                     line={"color": colors[feature]}), row=i, col=1)
        sh = shuffled[key]
        fig.add_trace(go.Scatter(x=[short_site_label(s) for s in sh], y=[sum(v) / len(v) for v in sh.values()],
                                 mode="lines", name="shuffled-target probe", legendgroup="shuffled",
                                 showlegend=(i == 1), line={"color": "black", "dash": "dot"}), row=i, col=1)
        fig.add_hline(y=1.0, line_dash="dash", line_color="gray", row=i, col=1)
        fig.update_yaxes(title_text="NRMSE", range=[0, 1.4], row=i, col=1)
    fig.update_layout(title=f"Position probes ({probe}): NRMSE on held-out sequences (1.0 = predicting the mean)",
                      height=180 + 300 * len(keys), width=1000)
    return fig


def run_probes(
    out_root: str | Path, models: dict[tuple[str, str], tuple[HookedTransformer, tasks_pkg.Task, frozenset[str]]],
    n_prompts: int = 128, sites: Sequence[str] | None = None, features: Sequence[str] = FEATURES,
    probes: Sequence[str] = PROBES, seeds: Sequence[int] = (0, 1), log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Probe every ``models[(task, label)] = (model, task, excluded prompts)``; write JSON, CSV, figure."""
    out_root = Path(out_root)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for (task_name, label), (model, task, exclude) in models.items():
        new = probe_model(model, task, n_prompts, sites, features, probes, seeds, exclude)
        rows += [{"task": task_name, "model": label, **r} for r in new]
        log(f"{task_name} {label}: {len(new)} probes ({time.perf_counter() - t0:.0f}s)")
    result = {"n_prompts": n_prompts, "features": list(features), "probes": list(probes), "seeds": list(seeds),
              "normaliser": "NRMSE = RMSE / std of the held-out targets", "rows": rows, **io.provenance()}
    io.write_json(out_root / "results" / "probe" / "probe.json", result)
    io.atomic_write_text(out_root / "results" / "probe" / "probe.csv", to_csv(rows))
    for probe in probes:
        save_figure(plot_probe_nrmse(rows, probe), out_root / "figures" / "probe" / f"nrmse_by_site_{probe}.html")
    result["wall_time_s"] = round(time.perf_counter() - t0, 1)
    return result
