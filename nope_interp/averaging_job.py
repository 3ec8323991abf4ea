"""``nope-interp averaging``: the averaging-effect checks on initialised, trained and control models.

For each task: a freshly initialised NoPE model (paper shape), the shipped trained model and a
bidirectional NoPE control (paper shape, initialised). Writes ``results/averaging/averaging.json``
and ``.csv`` and ``figures/averaging/*.html``.
"""

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.averaging_report import averaging_report, counterfactual_report
from nope_interp.hooks import hook_name
from nope_interp.io import to_csv
from nope_interp.model import build_model, preset
from nope_interp.plotting import save_figure, short_site_label
from nope_interp.pretrained import available_pretrained, load_pretrained
from nope_interp.similarity import cosine_similarity_matrix


def plot_predicted_vs_observed(model: Any, task: tasks_pkg.Task, layer: int = 0, title: str = "") -> go.Figure:
    """Side-by-side heatmaps for one prompt: the cosine matrix predicted from the layer's attention
    pattern (heads summed, i.i.d. values) and the observed cosine matrix of ``hook_z``; scale [-1, 1]."""
    import torch

    prompt = task.analysis_prompts(1, seed=1)[0]
    names = {hook_name("pattern", layer), hook_name("z", layer)}
    with torch.no_grad():
        _, cache = model.run_with_cache(task.prompt_tokens([prompt]), names_filter=lambda n: n in names)
    pattern = cache[hook_name("pattern", layer)][0].double()
    gram = torch.einsum("hqk,hpk->qp", pattern, pattern)
    d = gram.diagonal().sqrt()
    pred = (gram / (d[:, None] * d[None, :])).clamp(-1, 1)
    obs = cosine_similarity_matrix(cache[hook_name("z", layer)][0].flatten(-2))
    axis = [f"{i}:{c}" for i, c in enumerate(prompt)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["predicted from the attention pattern", "observed (hook_z)"])
    for c, m in enumerate((pred, obs), start=1):
        fig.add_trace(go.Heatmap(z=m.numpy(), x=axis, y=axis, zmin=-1, zmax=1, zmid=0, colorscale="RdBu_r",
                                 showscale=(c == 2), colorbar={"title": "cosine"}), row=1, col=c)
        fig.update_yaxes(autorange="reversed", row=1, col=c)
    fig.update_layout(title=title or f"{task.name}, layer {layer}: predicted vs observed cosine",
                      width=1300, height=650)
    return fig


def plot_counterfactuals(results: dict[str, dict[str, Any]]) -> go.Figure:
    """Adjacency score by site for each layer-0 pattern condition, one panel per task (trained models)."""
    task_names = list(results)
    fig = make_subplots(rows=len(task_names), cols=1, subplot_titles=task_names,
                        vertical_spacing=0.45 / max(2, len(task_names)))
    colors = {"clean": "#1f77b4", "uniform": "#2ca02c", "identity": "#d62728", "random_matched": "#9467bd"}
    for r, t in enumerate(task_names, start=1):
        for kind, cond in results[t]["conditions"].items():
            sites = list(cond["scores"])
            acc = cond["exact_match"]
            label = kind if acc is None else f"{kind} (exact match {acc:.3f})"
            fig.add_trace(go.Scatter(x=[short_site_label(s) for s in sites], y=[cond["scores"][s] for s in sites],
                                     mode="lines+markers",
                                     name=label, line={"color": colors.get(kind)}), row=r, col=1)
        fig.update_yaxes(range=[0, 1.05], title_text="adjacency", row=r, col=1)
    fig.update_xaxes(tickangle=-60, tickfont={"size": 9})
    fig.update_layout(title="Layer-0 attention replaced: adjacency score at every later site (trained models)",
                      height=200 + 330 * len(task_names), width=1100)
    return fig


def run_averaging(
    out_root: str | Path = ".", task_names: Sequence[str] = tasks_pkg.TASK_NAMES, n_prompts: int = 64,
    eval_n: int = 500, log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Run every check for every task and write JSON, CSV and figures; returns the JSON dict."""
    out_root = Path(out_root)
    for t in task_names:
        tasks_pkg.get_task(t)
    t0 = time.perf_counter()
    result: dict[str, Any] = {"n_prompts": n_prompts, "eval_n": eval_n, "tasks": {}, **io.provenance()}
    csv_rows: list[dict[str, Any]] = []
    counterfactuals: dict[str, dict[str, Any]] = {}
    fig_dir = out_root / "figures" / "averaging"
    for name in task_names:
        task = tasks_pkg.get_task(name)
        models: dict[str, Any] = {"initialised": build_model(preset("paper")),
                                  "bidirectional_control": build_model(preset("paper", attention="bidirectional"))}
        eval_examples = None
        if name in available_pretrained():
            run = load_pretrained(name)
            models["trained"] = run.model
            tc = run.train_cfg
            eval_examples = task.splits(tc.n_train, tc.n_test, tc.data_seed).test[:eval_n]
        entry: dict[str, Any] = {}
        for label, model in models.items():
            rep = averaging_report(model, task, n_prompts)
            cf = counterfactual_report(model, task, 0, n_prompts=n_prompts,
                                       eval_examples=eval_examples if label == "trained" else None)
            entry[label] = {"averaging": rep, "counterfactual": cf}
            for lay in rep["layers"]:
                csv_rows.append({"task": name, "model": label, "layer": lay["layer"],
                                 "spearman_pred_obs": lay["heads_concat"]["spearman_pred_obs"],
                                 "adjacency_predicted": lay["heads_concat"]["adjacency_predicted"],
                                 "adjacency_observed": lay["heads_concat"]["adjacency_observed"],
                                 "relative_entropy": lay["relative_entropy"], "closed_form_mae": lay["closed_form_mae"],
                                 "variance_vs_1_over_k_spearman": lay["variance_vs_1_over_k_spearman"],
                                 "z_identity_max_abs_err": lay["z_identity_max_abs_err"]})
            for kind, cond in cf["conditions"].items():
                csv_rows.append({"task": name, "model": label, "condition": kind, "exact_match": cond["exact_match"],
                                 **{f"adjacency@{s}": v for s, v in cond["scores"].items()}})
            l0 = rep["layers"][0]
            log(f"{name} {label}: L0 entropy {l0['relative_entropy']:.3f}, predicted-vs-observed spearman "
                f"{l0['heads_concat']['spearman_pred_obs']:.3f}, sqrt(i/k) MAE {l0['closed_form_mae']:.3f} "
                f"({time.perf_counter() - t0:.0f}s)")
        if "trained" in models:
            counterfactuals[name] = entry["trained"]["counterfactual"]
            save_figure(plot_predicted_vs_observed(models["trained"], task, 0, f"{name}, trained model, layer 0"),
                        fig_dir / f"predicted_vs_observed_{name}_trained.html")
        save_figure(plot_predicted_vs_observed(models["initialised"], task, 0, f"{name}, initialised model, layer 0"),
                    fig_dir / f"predicted_vs_observed_{name}_initialised.html")
        result["tasks"][name] = entry
    if counterfactuals:
        save_figure(plot_counterfactuals(counterfactuals), fig_dir / "counterfactual_attention.html")
    result["wall_time_s"] = round(time.perf_counter() - t0, 1)
    io.write_json(out_root / "results" / "averaging" / "averaging.json", result)
    io.atomic_write_text(out_root / "results" / "averaging" / "averaging.csv", to_csv(csv_rows))
    return result

