"""When does the adjacency pattern appear? Initialisation and size grids, no training (paper.md claim 4).

Two grids of freshly initialised NoPE models, each analysed on every task's full-length prompts over
several seeds:

* ``init``: init mean x init std at the paper's shape (6 layers, d_model 384). Paper's grid: mean
  {0, 4, 8} x std {0.002, 0.02, 0.2}; ``wide_std`` adds the authors' wider std list 0.0002 ... 2.
* ``size``: depth {6, 12, 24} x width {192, 384, 768} at the default init N(0, 0.02).

Each row records the adjacency score (row mean, averaged over prompts) at ``attn.hook_z`` (what the
authors measured) and ``hook_resid_post`` of every layer, and the first layer's attention entropy
relative to uniform (the proposed cause).
"""

import itertools
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import tasks as tasks_pkg
from nope_interp.averaging import relative_entropy_to_uniform
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name
from nope_interp.model import build_model, preset
from nope_interp.similarity import adjacency_score, cosine_similarity_matrix

WIDE_STDS = (0.0002, 0.002, 0.02, 0.2, 2.0)


@dataclass(frozen=True)
class GridConfig:
    """What the grid covers. ``quick()`` is a 2-minute version; the default takes about 20 minutes."""

    means: tuple[float, ...] = (0.0, 4.0, 8.0)
    stds: tuple[float, ...] = (0.002, 0.02, 0.2)
    depths: tuple[int, ...] = (6, 12, 24)
    widths: tuple[int, ...] = (192, 384, 768)
    n_heads: int = 6
    task_names: tuple[str, ...] = tasks_pkg.TASK_NAMES
    seeds: int = 5
    n_prompts: int = 32

    def __post_init__(self) -> None:
        for t in self.task_names:
            tasks_pkg.get_task(t)
        if self.seeds < 1 or self.n_prompts < 1:
            raise NopeInterpError("seeds and n_prompts must be positive integers")
        if any(s <= 0 for s in self.stds):
            raise NopeInterpError(f"stds must be positive, got {self.stds}")
        if any(w % self.n_heads for w in self.widths):
            raise NopeInterpError(f"every width must be a multiple of n_heads={self.n_heads}, got {self.widths}")

    @classmethod
    def quick(cls, **overrides: Any) -> "GridConfig":
        """A small grid: the paper's 3 x 3 init grid at 6 x 384, sizes (6, 12) x (192, 384), 2 seeds."""
        base = {"depths": (6, 12), "widths": (192, 384), "seeds": 2, "n_prompts": 16}
        return cls(**{**base, **overrides})


def _analyse(model: Any, task: tasks_pkg.Task, n_prompts: int, seed: int) -> dict[str, Any]:
    n_layers = model.cfg.n_layers
    names = {hook_name("pattern", 0)}
    names |= {hook_name(p, layer) for layer in range(n_layers) for p in ("z", "resid_post")}
    tokens = task.prompt_tokens(task.analysis_prompts(n_prompts, seed))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, return_type=None)
    entropy = relative_entropy_to_uniform(cache[hook_name("pattern", 0)])[..., 1:].mean()
    out: dict[str, Any] = {"l0_relative_entropy": float(entropy)}
    for layer in range(n_layers):
        z = cache[hook_name("z", layer)].flatten(-2)
        out[f"z_L{layer}"] = float(adjacency_score(cosine_similarity_matrix(z)).mean())
        resid = cache[hook_name("resid_post", layer)]
        out[f"resid_post_L{layer}"] = float(adjacency_score(cosine_similarity_matrix(resid)).mean())
    return out


def run_init_grid(cfg: GridConfig, log: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """All rows of both grids (one per grid point, task and seed). Progress goes to ``log``."""
    points = [("init", 6, 384, m, s) for m, s in itertools.product(cfg.means, cfg.stds)]
    points += [("size", d, w, 0.0, 0.02) for d, w in itertools.product(cfg.depths, cfg.widths)]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    total = len(points) * cfg.seeds
    done = 0
    for grid, depth, width, mean, std in points:
        for seed in range(cfg.seeds):
            model_cfg = preset("paper", n_layers=depth, d_model=width, n_heads=cfg.n_heads,
                               d_head=width // cfg.n_heads, d_mlp=4 * width, n_ctx=64, init_mean=mean,
                               init_std=std, seed=seed)
            model = build_model(model_cfg)
            for t in cfg.task_names:
                rows.append({"grid": grid, "task": t, "n_layers": depth, "d_model": width, "init_mean": mean,
                             "init_std": std, "seed": seed,
                             **_analyse(model, tasks_pkg.get_task(t), cfg.n_prompts, seed)})
            del model
            done += 1
            log(f"[{done}/{total}] {grid} grid: {depth}x{width}, N({mean}, {std}), seed {seed} "
                f"({time.perf_counter() - t0:.0f}s)")
    return rows


def summarize_grid(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds of each score, per grid point and task."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    keys = ("grid", "task", "n_layers", "d_model", "init_mean", "init_std")
    for r in rows:
        groups[tuple(r[k] for k in keys)].append(r)
    out = []
    for key, rs in groups.items():
        entry = dict(zip(keys, key, strict=True))
        entry["n_seeds"] = len(rs)
        for metric in [k for k in rs[0] if k not in (*keys, "seed")]:
            vals = torch.tensor([r[metric] for r in rs], dtype=torch.float64)
            entry[f"{metric}_mean"] = float(vals.mean())
            entry[f"{metric}_std"] = float(vals.std()) if len(rs) > 1 else 0.0
        out.append(entry)
    return out


def plot_grid(summary: list[dict[str, Any]], grid: str, site: str = "z_L0") -> go.Figure:
    """Heatmaps of the mean adjacency score at ``site`` over the grid, one panel per task.

    ``grid="init"``: rows init std, columns init mean. ``grid="size"``: rows depth, columns width.
    Colour scale fixed to [0, 1] (0.5 = chance).
    """
    rows = [r for r in summary if r["grid"] == grid]
    if not rows:
        raise NopeInterpError(f"no rows for grid {grid!r}")
    ykey, xkey = ("init_std", "init_mean") if grid == "init" else ("n_layers", "d_model")
    task_names = list(dict.fromkeys(r["task"] for r in rows))
    fig = make_subplots(rows=1, cols=len(task_names), subplot_titles=task_names, horizontal_spacing=0.06)
    for c, t in enumerate(task_names, start=1):
        ys = sorted({r[ykey] for r in rows})
        xs = sorted({r[xkey] for r in rows})
        cell = {(r[ykey], r[xkey]): r for r in rows if r["task"] == t}
        z = [[cell[(y, x)].get(f"{site}_mean") if (y, x) in cell else None for x in xs] for y in ys]
        text = [[("" if cell.get((y, x)) is None or cell[(y, x)].get(f"{site}_mean") is None else
                  f"{cell[(y, x)][f'{site}_mean']:.2f}±{cell[(y, x)][f'{site}_std']:.2f}") for x in xs] for y in ys]
        fig.add_trace(go.Heatmap(z=z, x=[str(x) for x in xs], y=[str(y) for y in ys], zmin=0, zmax=1,
                                 colorscale="Viridis", text=text, texttemplate="%{text}", showscale=(c == 1),
                                 colorbar={"title": "adjacency"}), row=1, col=c)
        fig.update_xaxes(title_text=xkey, type="category", row=1, col=c)
        fig.update_yaxes(title_text=ykey if c == 1 else None, type="category", row=1, col=c)
    fig.update_layout(title=f"{grid} grid: adjacency score at {site} (mean ± std over seeds; 0.5 = chance)",
                      width=380 * len(task_names), height=460)
    return fig


def plot_entropy_vs_score(rows: list[dict[str, Any]], site: str = "z_L0") -> go.Figure:
    """Scatter: first-layer attention entropy (relative to uniform) against the adjacency score at ``site``."""
    fig = go.Figure()
    for grid in ("init", "size"):
        rs = [r for r in rows if r["grid"] == grid and site in r]
        fig.add_trace(go.Scatter(
            x=[r["l0_relative_entropy"] for r in rs], y=[r[site] for r in rs], mode="markers", name=f"{grid} grid",
            text=[f"{r['task']} {r['n_layers']}x{r['d_model']} N({r['init_mean']},{r['init_std']}) s{r['seed']}"
                  for r in rs], hovertemplate="%{text}<br>entropy %{x:.3f}<br>score %{y:.3f}"))
    fig.update_layout(title=f"Layer-0 attention entropy (1 = uniform) vs adjacency score at {site}",
                      xaxis_title="relative entropy of layer-0 attention", yaxis_title="adjacency score",
                      yaxis_range=[0, 1.05], width=800, height=520)
    return fig


def grid_config_dict(cfg: GridConfig) -> dict[str, Any]:
    """JSON-ready config."""
    return asdict(cfg)
