"""``nope-interp ablate``: accuracy and loss lost when the positional structure is scrambled or removed.

For a trained model and its task: estimate the positional means mu at each ablated site on held-out
full-length prompts (disjoint from the training prompts and from the evaluation prompts), then apply
each ablation of :mod:`nope_interp.ablations` at that site and measure exact match (greedy decoding),
answer-token loss (teacher forcing) and the adjacency score at every site, against the clean baseline.
Before ablating, each site is split into positional mean and content part
(:func:`nope_interp.ablations.positional_decomposition`: variance share and adjacency of each part).
The rank curve: exact match with the top-r positional subspace projected out, beside the same with
random subspaces of rank r (several draws: mean and spread).
"""

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.ablations import (
    ablation_hook,
    positional_decomposition,
    positional_means,
    positional_subspace,
    random_subspace,
)
from nope_interp.analysis import analyze_model
from nope_interp.errors import NopeInterpError
from nope_interp.evaluate import exact_match_accuracy
from nope_interp.hooks import hook_name
from nope_interp.io import to_csv
from nope_interp.plotting import save_figure, short_site_label
from nope_interp.train import answer_loss

KINDS = ("shuffle_positional", "mean_positional", "project_out", "project_out_random", "shuffle_vectors",
         "swap_prompts")


#: One colour per ablation kind, shared by the per-run and the seed figures.
KIND_COLORS = dict(zip(KINDS, ["#d62728", "#ff7f0e", "#1f77b4", "#aec7e8", "#7f7f7f", "#2ca02c"], strict=True))


def default_sites(n_layers: int) -> list[str]:
    """``hook_resid_pre`` of every layer after the first (where the pattern exists), and the last resid_post."""
    return [hook_name("resid_pre", layer) for layer in range(1, n_layers)] + [hook_name("resid_post", n_layers - 1)]


@torch.no_grad()
def _site_acts(model: HookedTransformer, task: tasks_pkg.Task, prompts: list[str], site: str) -> torch.Tensor:
    _, cache = model.run_with_cache(task.prompt_tokens(prompts), names_filter=site, return_type=None)
    return cache[site]


def _measure(model: HookedTransformer, task: tasks_pkg.Task, examples: Sequence[tasks_pkg.Example],
             n_analysis: int, hooks: list, with_scores: bool = True) -> dict[str, Any]:
    with model.hooks(fwd_hooks=hooks):
        acc = exact_match_accuracy(model, task, examples)
        with torch.no_grad():
            loss = float(answer_loss(model, task.training_batch(list(examples))))
        scores = (analyze_model(model, task, n_analysis, seed=3).scores["row_mean"] if with_scores else {})
    return {"exact_match": acc, "answer_loss": loss, "adjacency": {s: v["mean"] for s, v in scores.items()}}


def run_ablation(
    model: HookedTransformer, task: tasks_pkg.Task, train_prompts: frozenset[str],
    sites: Sequence[str] | None = None, kinds: Sequence[str] = KINDS, rank: int = 4,
    ranks: Sequence[int] = (0, 1, 2, 4, 8, 16), rank_site: str | None = None,
    n_random: int = 3, n_eval: int = 300, n_mu: int = 512, n_analysis: int = 48, seed: int = 0,
    log: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """Every ablation at every site, plus the rank curve at ``rank_site``, for one model.

    Args:
        model, task: a trained model and its task. train_prompts: prompts never used for mu or evaluation.
        sites: residual hook names (default :func:`default_sites`). kinds: ablations (default all).
        rank: the rank of ``project_out`` in the per-site table. ranks, rank_site, n_random: the rank
            curve (default site: the first entry of ``sites``). n_eval: full-length test prompts scored.
        n_mu: prompts to estimate mu. n_analysis: prompts for the adjacency scores. seed: permutations.

    Raises:
        NopeInterpError: unknown site or kind; too few distinct full-length prompts.
    """
    sites = list(sites or default_sites(model.cfg.n_layers))
    points = ("resid_pre", "resid_mid", "resid_post")
    valid = {hook_name(p, layer) for layer in range(model.cfg.n_layers) for p in points}
    bad = [s for s in sites if s not in valid]
    if bad:
        raise NopeInterpError(f"unknown residual site(s) {bad}; allowed: {', '.join(sorted(valid))}")
    for k in kinds:
        if k not in KINDS:
            raise NopeInterpError(f"unknown ablation {k!r}; allowed: {', '.join(KINDS)}")
    rank_site = rank_site or sites[0]
    n_prompt = task.max_prompt_len
    eval_prompts = task.analysis_prompts(n_eval, seed=11, exclude=train_prompts)
    examples = [task.example(p) for p in eval_prompts]
    mu_prompts = task.analysis_prompts(n_mu, seed=12, exclude=train_prompts | frozenset(eval_prompts))
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"task": task.name, "n_eval": len(examples), "n_mu": len(mu_prompts), "rank": rank,
                           "clean": _measure(model, task, examples, n_analysis, []), "sites": {},
                           "decomposition": {}}
    for site in sites:
        acts = _site_acts(model, task, mu_prompts, site)
        mu = positional_means(acts)
        try:
            out["decomposition"][site] = positional_decomposition(acts)
        except NopeInterpError as err:  # a degenerate model: report it, do not lose the ablations
            out["decomposition"][site] = {"error": str(err)}
        per: dict[str, Any] = {}
        for kind in kinds:
            perm = torch.randperm(n_prompt, generator=gen)
            if kind == "project_out":
                basis = positional_subspace(mu, rank)
            elif kind == "project_out_random":
                basis = random_subspace(mu.shape[1], rank, gen)
            else:
                basis = None
            hook = ablation_hook(kind, mu, perm=perm, basis=basis, generator=gen)
            per[kind] = _measure(model, task, examples, n_analysis, [(site, hook)])
        out["sites"][site] = per
        dec = out["decomposition"][site]
        log(f"{task.name} {site}: decomposition not computed: {dec['error']}" if "error" in dec else
            f"{task.name} {site}: position explains {dec['positional_variance_fraction']:.2f} of the variance; "
            f"adjacency full {dec['adjacency_full']:.2f}, positional mean {dec['adjacency_positional']:.2f}, "
            f"content {dec['adjacency_content']:.2f}")
        log(f"{task.name} {site}: " + ", ".join(f"{k} {v['exact_match']:.3f}" for k, v in per.items())
            + f" (clean {out['clean']['exact_match']:.3f}; {time.perf_counter() - t0:.0f}s)")
    mu = positional_means(_site_acts(model, task, mu_prompts, rank_site))
    curve = []
    max_rank = min(mu.shape[0] - 1, mu.shape[1])  # the centred means span at most pos - 1 directions
    skipped = [r for r in ranks if r > max_rank]
    for r in [r for r in ranks if r <= max_rank]:
        pos = _measure(model, task, examples, n_analysis,
                       [(rank_site, ablation_hook("project_out", mu, basis=positional_subspace(mu, r)))], False)
        rand = []
        for _ in range(n_random):
            hook = ablation_hook("project_out_random", mu, basis=random_subspace(mu.shape[1], r, gen))
            rand.append(_measure(model, task, examples, n_analysis, [(rank_site, hook)], False)["exact_match"])
        rt = torch.tensor(rand, dtype=torch.float64)
        curve.append({"rank": r, "positional": pos["exact_match"], "random_mean": float(rt.mean()),
                      "random_std": float(rt.std()) if len(rand) > 1 else 0.0, "random_draws": rand})
    out["rank_curve"] = {"site": rank_site, "points": curve, "max_rank": max_rank, "skipped_ranks": skipped}
    log(f"{task.name} rank curve at {rank_site}: " + ", ".join(
        f"r={c['rank']}: {c['positional']:.3f} vs random {c['random_mean']:.3f}" for c in curve))
    return out


def ablation_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat CSV rows: one per site and ablation (accuracy and loss deltas against clean)."""
    clean = result["clean"]
    rows = [{"task": result["task"], "site": "-", "ablation": "clean", "exact_match": clean["exact_match"],
             "accuracy_loss": 0.0, "answer_loss": clean["answer_loss"], "loss_increase": 0.0}]
    for site, per in result["sites"].items():
        for kind, m in per.items():
            rows.append({"task": result["task"], "site": site, "ablation": kind, "exact_match": m["exact_match"],
                         "accuracy_loss": clean["exact_match"] - m["exact_match"], "answer_loss": m["answer_loss"],
                         "loss_increase": m["answer_loss"] - clean["answer_loss"]})
    return rows


DECOMPOSITION_KEYS = ("positional_variance_fraction", "adjacency_full", "adjacency_positional", "adjacency_content")


def decomposition_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat CSV rows: one per site with the positional/content decomposition of the clean model (or its
    ``error`` when it could not be computed)."""
    return [{"task": result["task"], "site": site, **{k: (" ".join(map(str, v)) if isinstance(v, list) else v)
                                                      for k, v in dec.items()}}
            for site, dec in result.get("decomposition", {}).items()]


def _mean_std_ci(values: Sequence[float]) -> dict[str, float]:
    """Mean, sample std and the 95% confidence interval of the mean (Student t; scipy) over seeds."""
    from scipy import stats

    v = torch.tensor(list(values), dtype=torch.float64)
    n = len(values)
    mean = float(v.mean())
    std = float(v.std()) if n > 1 else 0.0
    half = float(stats.t.ppf(0.975, n - 1) * std / n**0.5) if n > 1 else float("nan")
    return {"mean": mean, "std": std, "ci95_low": mean - half, "ci95_high": mean + half, "n_seeds": n}


def seed_summary(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Across runs of the same task (seeds): mean, std and 95% CI of the accuracy lost per site and
    ablation, of exact match on the rank curve (positional and random) and of the positional/content
    decomposition per site. The CI is Student's t over seeds (scipy), so with 3 seeds it is wide."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_task.setdefault(r["task"], []).append(r)
    out: dict[str, Any] = {}
    for task, runs in by_task.items():
        entry: dict[str, Any] = {"runs": [r.get("run") for r in runs],
                                 "clean_exact_match": _mean_std_ci([r["clean"]["exact_match"] for r in runs]),
                                 "accuracy_loss": {}, "rank_curve": {}, "decomposition": {}}
        for site in runs[0]["sites"]:
            if not all(site in r["sites"] for r in runs):
                continue
            entry["accuracy_loss"][site] = {
                kind: _mean_std_ci([r["clean"]["exact_match"] - r["sites"][site][kind]["exact_match"] for r in runs])
                for kind in runs[0]["sites"][site] if all(kind in r["sites"][site] for r in runs)}
        for site in runs[0].get("decomposition", {}):
            if all("error" not in r.get("decomposition", {}).get(site, {"error": ""}) for r in runs):
                entry["decomposition"][site] = {
                    key: _mean_std_ci([r["decomposition"][site][key] for r in runs]) for key in DECOMPOSITION_KEYS}
        ranks = [p["rank"] for p in runs[0]["rank_curve"]["points"]]
        for i, rank in enumerate(ranks):
            if all(len(r["rank_curve"]["points"]) > i and r["rank_curve"]["points"][i]["rank"] == rank for r in runs):
                entry["rank_curve"][str(rank)] = {
                    "positional": _mean_std_ci([r["rank_curve"]["points"][i]["positional"] for r in runs]),
                    "random": _mean_std_ci([r["rank_curve"]["points"][i]["random_mean"] for r in runs])}
        out[task] = entry
    return out


def _run_name(run: str | None, task: str) -> str:
    """A run's short name: ``shipped`` for ``pretrained/<task>``, else its directory name ("?" if unknown)."""
    if not run:
        return "?"
    return "shipped" if Path(run).name == task else Path(run).name


def _run_label(result: dict[str, Any]) -> str:
    return f"{result['task']} ({_run_name(result['run'], result['task'])})" if result.get("run") else result["task"]


def plot_ablations(results: Sequence[dict[str, Any]]) -> go.Figure:
    """Per task: accuracy lost by site and ablation (bars), and the rank curve with its random band."""
    fig = make_subplots(rows=len(results), cols=2, column_widths=[0.6, 0.4],
                        subplot_titles=[t for r in results for t in
                                        (f"{_run_label(r)}: exact match lost", f"{_run_label(r)}: rank curve at "
                                         f"{short_site_label(r['rank_curve']['site'])}")],
                        vertical_spacing=0.4 / max(2, len(results)))
    for i, res in enumerate(results, start=1):
        sites = list(res["sites"])
        for kind in next(iter(res["sites"].values())):
            fig.add_trace(go.Bar(x=[short_site_label(s) for s in sites],
                                 y=[res["clean"]["exact_match"] - res["sites"][s][kind]["exact_match"] for s in sites],
                                 name=kind, legendgroup=kind, showlegend=(i == 1), marker_color=KIND_COLORS[kind]),
                          row=i, col=1)
        pts = res["rank_curve"]["points"]
        x = [p["rank"] for p in pts]
        hi = [p["random_mean"] + p["random_std"] for p in pts]
        lo = [p["random_mean"] - p["random_std"] for p in pts]
        fig.add_trace(go.Scatter(x=x + x[::-1], y=hi + lo[::-1], mode="lines", fill="toself",
                                 fillcolor="rgba(120,120,120,0.25)",
                                 line={"width": 0}, name="random r removed (mean ± std)", legendgroup="band",
                                 showlegend=(i == 1)), row=i, col=2)
        fig.add_trace(go.Scatter(x=x, y=[p["random_mean"] for p in pts], mode="lines", line={"color": "gray"},
                                 showlegend=False), row=i, col=2)
        fig.add_trace(go.Scatter(x=x, y=[p["positional"] for p in pts], mode="lines+markers",
                                 line={"color": "#1f77b4"}, name="top-r positional removed",
                                 legendgroup="pos", showlegend=(i == 1)), row=i, col=2)
        fig.update_yaxes(title_text="accuracy lost", row=i, col=1)
        fig.update_yaxes(title_text="exact match", range=[-0.02, 1.02], row=i, col=2)
        fig.update_xaxes(title_text="rank r", row=i, col=2)
    fig.update_layout(barmode="group", title="Ablating the positional structure of the residual stream",
                      height=200 + 360 * len(results), width=1250)
    return fig


def seed_markdown(seeds: dict[str, Any], results: Sequence[dict[str, Any]] = ()) -> str:
    """The seed summary as Markdown tables: per task, the accuracy lost (mean ± std [95% CI]) by site and
    ablation, the rank curve (positional vs random) and the position/content decomposition; with
    ``results``, also each run's own exact match (clean and under every ablation) per site, which is
    what to read when the runs' clean accuracies differ a lot."""

    def fmt(st: dict[str, float]) -> str:
        if st["n_seeds"] < 2:
            return f"{st['mean']:.3f}"
        return f"{st['mean']:.3f} ± {st['std']:.3f} [{st['ci95_low']:.2f}, {st['ci95_high']:.2f}]"

    lines = ["# Ablations over seeds", "",
             "mean ± sample std [95% Student-t CI of the mean] over the runs of each task; accuracy lost = clean "
             "exact match - ablated exact match.", ""]
    for task, e in seeds.items():
        n = e["clean_exact_match"]["n_seeds"]
        lines += [f"## {task} ({n} run{'s' if n != 1 else ''}; clean exact match {fmt(e['clean_exact_match'])})", ""]
        lines += ["runs: " + ", ".join(_run_name(r, task) for r in e["runs"]), ""]
        kinds = list(next(iter(e["accuracy_loss"].values()), {}))
        lines += ["| site | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
        lines += [f"| {site} | " + " | ".join(fmt(per[k]) for k in kinds) + " |"
                  for site, per in e["accuracy_loss"].items()]
        lines += ["", "| rank r | exact match, positional removed | exact match, random removed |", "|---|---|---|"]
        lines += [f"| {r} | {fmt(c['positional'])} | {fmt(c['random'])} |" for r, c in e["rank_curve"].items()]
        runs = [r for r in results if r["task"] == task]
        if runs:
            kinds_run = list(next(iter(runs[0]["sites"].values()), {}))
            lines += ["", "Exact match of each run:", "",
                      "| run | site | clean | " + " | ".join(kinds_run) + " |", "|---" * (len(kinds_run) + 3) + "|"]
            for r in runs:
                name = _run_name(r.get("run"), task)
                lines += [f"| {name} | {site} | {r['clean']['exact_match']:.3f} | "
                          + " | ".join(f"{per[k]['exact_match']:.3f}" if k in per else "" for k in kinds_run) + " |"
                          for site, per in r["sites"].items()]
        if e.get("decomposition"):
            lines += ["", "| site | " + " | ".join(DECOMPOSITION_KEYS) + " |",
                      "|---" * (len(DECOMPOSITION_KEYS) + 1) + "|"]
            lines += [f"| {site} | " + " | ".join(fmt(d[k]) for k in DECOMPOSITION_KEYS) + " |"
                      for site, d in e["decomposition"].items()]
        lines.append("")
    return "\n".join(lines)


def plot_seed_summary(seeds: dict[str, Any]) -> go.Figure:
    """Per task, over seeds: mean accuracy lost by site and ablation with 95% CI error bars; the rank
    curve (mean exact match, bars = std over seeds) for the positional and the random subspace; and the
    clean model's decomposition per site (adjacency of h, of the positional mean mu and of the content
    h - mu, and the share of variance explained by position; bars = std over seeds)."""
    tasks = list(seeds)
    titles = []
    for task in tasks:
        n = seeds[task]["clean_exact_match"]["n_seeds"]
        titles += [f"{task}: exact match lost ({n} seeds, mean, 95% CI)", f"{task}: rank curve (mean ± std)",
                   f"{task}: position vs content (clean)"]
    fig = make_subplots(rows=len(tasks), cols=3, column_widths=[0.45, 0.27, 0.28], subplot_titles=titles,
                        vertical_spacing=0.4 / max(2, len(tasks)), horizontal_spacing=0.06)
    dec_colors = dict(zip(DECOMPOSITION_KEYS, ["#9467bd", "#8c564b", "#17becf", "#bcbd22"], strict=True))
    dec_labels = dict(zip(DECOMPOSITION_KEYS, ["variance share of mu", "adjacency of h", "adjacency of mu",
                                               "adjacency of h - mu"], strict=True))
    shown: set[str] = set()

    def bar(x: list[str], st: list[dict[str, float]], name: str, color: str, half: str, row: int, col: int) -> None:
        err = [(x_["ci95_high"] - x_["mean"]) if half == "ci" else x_["std"] for x_ in st]
        err = [0.0 if e != e else e for e in err]  # one seed: no interval
        fig.add_trace(go.Bar(x=x, y=[x_["mean"] for x_ in st], name=name, legendgroup=name,
                             showlegend=name not in shown, marker_color=color,
                             error_y={"type": "data", "array": err, "visible": True}), row=row, col=col)
        shown.add(name)

    for i, task in enumerate(tasks, start=1):
        e = seeds[task]
        sites = list(e["accuracy_loss"])
        labels = [short_site_label(s) for s in sites]
        for kind in next(iter(e["accuracy_loss"].values()), {}):
            bar(labels, [e["accuracy_loss"][s][kind] for s in sites], kind, KIND_COLORS[kind], "ci", i, 1)
        ranks = [int(r) for r in e["rank_curve"]]
        for which, color, dash in (("positional", "#1f77b4", None), ("random", "gray", "dash")):
            st = [e["rank_curve"][str(r)][which] for r in ranks]
            name = "top-r positional out" if which == "positional" else "random r out"
            fig.add_trace(go.Scatter(x=ranks, y=[x["mean"] for x in st], mode="lines+markers", name=name,
                                     legendgroup=which, showlegend=name not in shown,
                                     line={"color": color, "dash": dash},
                                     error_y={"type": "data", "array": [x["std"] for x in st], "visible": True}),
                          row=i, col=2)
            shown.add(name)
        dec_sites = list(e.get("decomposition", {}))
        for key in DECOMPOSITION_KEYS if dec_sites else ():
            bar([short_site_label(s) for s in dec_sites], [e["decomposition"][s][key] for s in dec_sites],
                dec_labels[key], dec_colors[key], "std", i, 3)
        fig.update_yaxes(title_text="accuracy lost", row=i, col=1)
        fig.update_yaxes(title_text="exact match", range=[-0.05, 1.05], row=i, col=2)
        fig.add_hline(y=0.5, line_dash="dot", line_color="black", row=i, col=3)  # chance adjacency
        fig.update_yaxes(title_text="score / share (dots: chance adjacency)", range=[0, 1.05], row=i, col=3)
        fig.update_xaxes(title_text="rank r", row=i, col=2)
    fig.update_layout(barmode="group", title="Ablations over seeds (same recipe, other --seed/--model-seed)",
                      height=220 + 380 * len(tasks), width=1620, legend={"font": {"size": 11}})
    return fig


def write_ablations(out_root: str | Path, results: Sequence[dict[str, Any]]) -> list[Path]:
    """Write results/ablate/ablate.json, ablate.csv, ablate_seeds.csv, ablate_seeds.md, ablate_decomposition.csv,
    figures/ablate/ablations.html and (when some task has 2 or more runs) ablations_seeds.html; return
    the paths."""
    root = Path(out_root)
    res_dir = root / "results" / "ablate"
    rows = [{"run": r.get("run", ""), **row} for r in results for row in ablation_rows(r)]
    seeds = seed_summary(results)
    seed_rows = [{"task": task, "site": site, "ablation": kind, **stats}
                 for task, e in seeds.items()
                 for site, per in e["accuracy_loss"].items() for kind, stats in per.items()]
    dec_rows = [{"run": r.get("run", ""), **row} for r in results for row in decomposition_rows(r)]
    paths = [io.write_json(res_dir / "ablate.json", {"results": list(results), "seed_summary": seeds,
                                                     **io.provenance()}),
             io.atomic_write_text(res_dir / "ablate.csv", to_csv(rows)),
             io.atomic_write_text(res_dir / "ablate_seeds.csv", to_csv(seed_rows)),
             io.atomic_write_text(res_dir / "ablate_seeds.md", seed_markdown(seeds, results)),
             io.atomic_write_text(res_dir / "ablate_decomposition.csv", to_csv(dec_rows)),
             save_figure(plot_ablations(results), root / "figures" / "ablate" / "ablations.html")]
    multi = {t: e for t, e in seeds.items() if e["clean_exact_match"]["n_seeds"] > 1}
    seeds_fig = root / "figures" / "ablate" / "ablations_seeds.html"
    if multi:
        paths.append(save_figure(plot_seed_summary(multi), seeds_fig))
    else:
        seeds_fig.unlink(missing_ok=True)  # never leave a figure from an earlier call beside these results
    return paths
