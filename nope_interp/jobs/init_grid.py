"""``nope-interp init-grid``: when does the adjacency pattern appear? Initialisation and size grids, no training.

Two grids of freshly initialised NoPE models, each analysed on ``n_prompts`` full-length prompts of every
task, over ``seeds`` seeds (seed ``s`` seeds both the init and the prompt sampler):

* ``init``: init mean x init std at the paper's shape (6 layers, d_model 384). Default grid: mean
  {0, 4, 8} x std {0.002, 0.02, 0.2}, as in Zuo, Guerzhoy & Guerzhoy (COLING 2025); ``wide_std`` uses
  the authors' wider std list 0.0002 ... 2.
* ``size``: depth {6, 12, 24} x width {192, 384, 768} at the default init N(0, 0.02).

Each row records the adjacency score (row mean, averaged over prompts; ``docs/method.md``) at
``blocks.{l}.attn.hook_z`` (what the authors measured) and ``blocks.{l}.hook_resid_post`` of every layer,
and the first layer's attention entropy relative to uniform (the proposed cause; ``docs/method.md``).
The summary gives mean, std and 95% CI over seeds (:func:`nope_interp.stats.mean_std_ci`) per grid point
and task. Writes ``results/init_grid/{init_grid.json, init_grid.csv, init_grid_summary.csv}`` and
``figures/init_grid/{init,size}_grid_{z,resid_post}_L0.html``, ``entropy_vs_score.html`` and the
``plotly.min.js`` they load.
"""

import itertools
import time
from collections import defaultdict
from dataclasses import InitVar, dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from transformer_lens import HookedTransformer

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.averaging import attention_window, relative_entropy_to_uniform
from nope_interp.config import (
    INIT_MEAN_MAX,
    INIT_STD_MAX,
    FrozenConfig,
    ModelConfig,
    check_choice,
    check_float,
    check_int,
    check_tasks,
    opt,
    preset,
)
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import Log, ModelEntry, emit, locked_write, progress
from nope_interp.model import build_model, check_model_fits
from nope_interp.plotting import add_chance_line, save_figure, with_plotlyjs
from nope_interp.similarity import adjacency_score_of_activations
from nope_interp.stats import SeedStats, fmt_mean_std, mean_std_ci

NAME = "init-grid"
HELP = JOB_HELP[NAME]
TAKES_MODELS = False
DEFAULT_MODELS = "freshly initialised models of every grid point (built by the job)"

#: The paper's init grid (means x stds) and size grid (depths x widths).
DEFAULT_MEANS: tuple[float, ...] = (0.0, 4.0, 8.0)
DEFAULT_STDS: tuple[float, ...] = (0.002, 0.02, 0.2)
DEFAULT_DEPTHS: tuple[int, ...] = (6, 12, 24)
DEFAULT_WIDTHS: tuple[int, ...] = (192, 384, 768)
#: The authors' wider std list (``wide_std``).
WIDE_STDS: tuple[float, ...] = (0.0002, 0.002, 0.02, 0.2, 2.0)
#: What ``quick`` and the full grid set when the field is not given.
QUICK_GRID: dict[str, Any] = {"depths": (6, 12), "widths": (192, 384), "seeds": 2, "n_prompts": 16}
FULL_GRID: dict[str, Any] = {"depths": DEFAULT_DEPTHS, "widths": DEFAULT_WIDTHS, "seeds": 5, "n_prompts": 32}
#: Shape (n_layers, d_model) of the init grid, init (mean, std) of the size grid, context of every model.
INIT_GRID_SHAPE = (6, 384)
SIZE_GRID_INIT = (0.0, 0.02)
N_CTX = 64
GRIDS = ("init", "size")
#: The hook points scored at every layer.
SCORED_POINTS = ("z", "resid_post")
#: Sites drawn as grid heatmaps, with the label used in their file names.
FIGURE_SITES = {hook_name("z", 0): "z_L0", hook_name("resid_post", 0): "resid_post_L0"}


@dataclass(frozen=True)
class InitGridConfig(FrozenConfig):
    """Settings of ``init-grid``: which grid points, tasks, seeds and prompts.

    ``quick`` and ``wide_std`` are resolved by ``__post_init__`` into the effective grid, so that after
    construction every other field holds what is run (the two keep what was asked for, and the result records
    it: :meth:`grid_dict`). ``seeds`` and ``n_prompts`` left at None become 2 and 16 with ``quick``, else 5 and
    32; ``depths`` and ``widths`` left at None become (6, 12) and (192, 384) with ``quick``, else
    :data:`DEFAULT_DEPTHS` and :data:`DEFAULT_WIDTHS`; ``stds`` left at None becomes :data:`WIDE_STDS` with
    ``wide_std``, else :data:`DEFAULT_STDS`. A value given explicitly always wins, even one equal to a default
    (before 2026-12-03 ``quick=True, depths=(6, 12, 24)`` ran (6, 12)), and :meth:`replace` fills anew what was
    not given (``replace(quick=False)`` gives the full grid; before, it kept the quick one). ``dataclasses.replace``
    does too, but refuses ``quick=False`` (or ``wide_std=False``) while the values they filled are carried over (a
    copy cannot tell them from values given; :meth:`~nope_interp.config.FrozenConfig._fill_unset`). A config read
    back by :meth:`~nope_interp.config.FrozenConfig.from_dict` counts a value equal to what its flags fill as filled,
    so the two do the same for it (before: both kept the quick grid).

    Raises:
        NopeInterpError: an empty grid axis; a mean outside [-1000, 1000]; a std outside (0, 1000] (NaN and
            inf never pass);
            a depth outside [1, 1000]; a width that is not a positive multiple of ``n_heads`` (384, the init
            grid's width, must be one too; the message names each such width once); an unknown task; ``seeds``
            outside [1, 1000]; ``n_prompts`` outside [1, 100000]; ``quick`` or ``wide_std`` not a bool.
    """

    means: tuple[float, ...] = opt(DEFAULT_MEANS, "init means of the init grid")
    stds: tuple[float, ...] | None = opt(None, "init stds of the init grid, > 0 (unset: 0.002 0.02 0.2; "
                                               "--wide-std: 0.0002 ... 2)")
    depths: tuple[int, ...] | None = opt(None, "layer counts of the size grid (unset: 6 12 24; --quick: 6 12)")
    widths: tuple[int, ...] | None = opt(None, "d_model values of the size grid, multiples of n_heads "
                                               "(unset: 192 384 768; --quick: 192 384)")
    n_heads: int = opt(6, "attention heads of every model (d_head = d_model / n_heads)")
    tasks: tuple[str, ...] = opt(tasks_pkg.TASK_NAMES, "tasks (default all four)")
    seeds: int | None = opt(None, "seeds per grid point (unset: 5; --quick 2)")
    n_prompts: int | None = opt(None, "prompts per task and seed (unset: 32; --quick 16)")
    quick: bool = opt(False, "a small grid: the paper's 3x3 init grid at 6x384, sizes (6,12)x(192,384), "
                             "2 seeds, 16 prompts")
    wide_std: bool = opt(False, "the authors' wider std list 0.0002 ... 2")
    _filled: InitVar[dict[str, Any] | None] = None  # what dataclasses.replace carries over (FrozenConfig._fill_unset)

    def __post_init__(self, _filled: dict[str, Any] | None = None) -> None:
        for name in ("quick", "wide_std"):
            if not isinstance(getattr(self, name), bool):
                raise NopeInterpError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("means", "stds", "depths", "widths", "tasks"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        # filled fields are remembered, so that replace(quick=False) fills them anew (before: it kept the quick grid)
        self._fill_unset({**(QUICK_GRID if self.quick else FULL_GRID),
                          "stds": WIDE_STDS if self.wide_std else DEFAULT_STDS}, _filled)
        for name in ("means", "stds", "depths", "widths", "tasks"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not value:
                raise NopeInterpError(f"{name} must be a non-empty list, got {value!r}")
        check_tasks(self.tasks)
        check_int("n_heads", self.n_heads, 1, 1024)
        check_int("seeds", self.seeds, 1, 1000)
        check_int("n_prompts", self.n_prompts, 1, 100_000)
        for m in self.means:
            check_float("means", m, -INIT_MEAN_MAX, INIT_MEAN_MAX)
        for s in self.stds:
            check_float("stds", s, 0.0, INIT_STD_MAX, low_open=True)
        for d in self.depths:
            check_int("depths", d, 1, 1000)
        for w in self.widths:
            check_int("widths", w, 1, 1_000_000)
        bad = list(dict.fromkeys(w for w in (*self.widths, INIT_GRID_SHAPE[1]) if w % self.n_heads))
        if bad:
            raise NopeInterpError.naming("{widths} (and {width}, the init grid's width) must be multiples of "
                                         "{n_heads}={value}, got {bad}", width=INIT_GRID_SHAPE[1], value=self.n_heads,
                                         bad=bad)

    def grid_dict(self) -> dict[str, Any]:
        """The effective grid as JSON, with ``quick`` and ``wide_std`` as asked for: every field they fill is
        filled already, so they record the request (``--wide-std --stds 0.5`` ran 0.5) and change nothing;
        :meth:`from_dict` of it gives the same config. (Before 2026-12-03 the two were left out, so a run
        with ``--wide-std`` overridden by ``--stds`` did not say it had been asked for.)"""
        return self.to_dict()


CONFIG = InitGridConfig


@dataclass(frozen=True)
class GridPoint:
    """One model shape and init of a grid.

    Attributes:
        grid: ``"init"`` or ``"size"``. n_layers, d_model: the model's shape.
        init_mean, init_std: every weight matrix is drawn from N(init_mean, init_std**2).
    """

    grid: str
    n_layers: int
    d_model: int
    init_mean: float
    init_std: float

    def model_config(self, n_heads: int, seed: int) -> ModelConfig:
        """The paper preset at this point: ``n_heads`` heads of width d_model / n_heads, d_mlp = 4 d_model,
        n_ctx 64, init seed ``seed``.

        Raises:
            NopeInterpError: d_model not a multiple of ``n_heads``, or another invalid size.
        """
        if self.d_model % n_heads:
            raise NopeInterpError(f"d_model {self.d_model} is not a multiple of n_heads={n_heads}")
        return preset("paper", n_layers=self.n_layers, d_model=self.d_model, n_heads=n_heads,
                      d_head=self.d_model // n_heads, d_mlp=4 * self.d_model, n_ctx=N_CTX,
                      init_mean=self.init_mean, init_std=self.init_std, seed=seed)


def grid_points(config: InitGridConfig) -> tuple[GridPoint, ...]:
    """Every point of both grids: the init grid (means x stds at 6 x 384) then the size grid
    (depths x widths at N(0, 0.02)), in the order they are run."""
    depth, width = INIT_GRID_SHAPE
    points = [GridPoint("init", depth, width, float(m), float(s)) for m, s in itertools.product(config.means,
                                                                                             config.stds)]
    points += [GridPoint("size", d, w, *SIZE_GRID_INIT) for d, w in itertools.product(config.depths, config.widths)]
    return tuple(points)


@dataclass(frozen=True)
class SiteScore:
    """The adjacency score (row mean, mean over prompts, in [0, 1]; 0.5 = chance) at one hook site."""

    site: str
    score: float


@dataclass(frozen=True)
class GridRow:
    """One grid point, task and seed.

    Attributes:
        grid, n_layers, d_model, init_mean, init_std: the grid point (:class:`GridPoint`).
        task: task name. seed: init and prompt seed.
        l0_relative_entropy: layer-0 attention entropy relative to uniform, mean over heads, prompts and
            query positions 1.. (1 = uniform, 0 = one-hot).
        scores: :class:`SiteScore` at ``blocks.{l}.attn.hook_z`` and ``blocks.{l}.hook_resid_post`` of
            every layer, layer by layer.
    """

    grid: str
    task: str
    n_layers: int
    d_model: int
    init_mean: float
    init_std: float
    seed: int
    l0_relative_entropy: float
    scores: tuple[SiteScore, ...]

    @property
    def sites(self) -> tuple[str, ...]:
        """The scored hook sites, in order."""
        return tuple(s.site for s in self.scores)

    def score(self, site: str) -> float:
        """The adjacency score at ``site`` (a full hook name).

        Raises:
            NopeInterpError: ``site`` was not scored in this row (e.g. a layer beyond ``n_layers``).
        """
        for s in self.scores:
            if s.site == site:
                return s.score
        raise NopeInterpError(f"site {site!r} was not scored for a {self.n_layers}-layer model; "
                              f"scored: {', '.join(self.sites)}")

    def to_dict(self) -> dict[str, Any]:
        """One CSV/JSON row: the point, task, seed, ``l0_relative_entropy`` and one column per site."""
        return {"grid": self.grid, "task": self.task, "n_layers": self.n_layers, "d_model": self.d_model,
                "init_mean": self.init_mean, "init_std": self.init_std, "seed": self.seed,
                "l0_relative_entropy": self.l0_relative_entropy, **{s.site: s.score for s in self.scores}}


@dataclass(frozen=True)
class SiteStats:
    """Statistics over seeds of the adjacency score at one hook site."""

    site: str
    stats: SeedStats


@dataclass(frozen=True)
class GridSummary:
    """One grid point and task, over seeds.

    Attributes:
        grid, task, n_layers, d_model, init_mean, init_std: as in :class:`GridRow`.
        n_seeds: number of seeds. l0_relative_entropy: its :class:`~nope_interp.stats.SeedStats`.
        scores: :class:`SiteStats` of every scored site, in the rows' order.
    """

    grid: str
    task: str
    n_layers: int
    d_model: int
    init_mean: float
    init_std: float
    n_seeds: int
    l0_relative_entropy: SeedStats
    scores: tuple[SiteStats, ...]

    def stats(self, site: str) -> SeedStats | None:
        """The statistics at ``site`` (a full hook name), or None when the models have no such layer."""
        return next((s.stats for s in self.scores if s.site == site), None)

    def to_dict(self) -> dict[str, Any]:
        """One summary row: the point, task, ``n_seeds`` and ``<metric>_mean``, ``<metric>_std`` for
        ``l0_relative_entropy`` and every site (the CI is in the Python result only)."""
        out: dict[str, Any] = {"grid": self.grid, "task": self.task, "n_layers": self.n_layers,
                               "d_model": self.d_model, "init_mean": self.init_mean, "init_std": self.init_std,
                               "n_seeds": self.n_seeds}
        for name, st in (("l0_relative_entropy", self.l0_relative_entropy), *((s.site, s.stats) for s in self.scores)):
            out[f"{name}_mean"] = st.mean
            out[f"{name}_std"] = st.std
        return out


@dataclass(frozen=True)
class InitGridResult:
    """What ``init-grid`` measured.

    Attributes:
        config: the effective settings. rows: one :class:`GridRow` per grid point, seed and task.
        summary: one :class:`GridSummary` per grid point and task. provenance: package version and git
            commit. wall_time_s: seconds.
    """

    config: InitGridConfig
    rows: tuple[GridRow, ...]
    summary: tuple[GridSummary, ...]
    provenance: dict[str, str | None]
    wall_time_s: float

    def to_dict(self) -> dict[str, Any]:
        """The contents of ``init_grid.json``: ``{"config" (:meth:`InitGridConfig.grid_dict`), "summary", "rows",
        provenance keys, "wall_time_s"}``."""
        return {"config": self.config.grid_dict(), "summary": [s.to_dict() for s in self.summary],
                "rows": [r.to_dict() for r in self.rows], **self.provenance, "wall_time_s": self.wall_time_s}


def default_models(config: InitGridConfig) -> list[ModelEntry]:
    """None: ``init-grid`` builds the model of each grid point and seed itself, one at a time
    (:meth:`GridPoint.model_config`), so the full grid never sits in memory at once. Returns ``[]``."""
    return []


def measure(model: HookedTransformer, task: tasks_pkg.Task, n_prompts: int,
            seed: int) -> tuple[float, tuple[SiteScore, ...]]:
    """Layer-0 relative attention entropy and the adjacency scores of one model on one task.

    ``n_prompts`` full-length prompts (``task.analysis_prompts(n_prompts, seed)``) are run once; at
    ``blocks.{l}.attn.hook_z`` (heads concatenated, ``batch pos n_heads*d_head``) and
    ``blocks.{l}.hook_resid_post`` (``batch pos d_model``) of every layer, the cosine similarity matrix of
    each prompt gives its row-mean adjacency score, averaged over prompts. The entropy is
    :func:`~nope_interp.averaging.relative_entropy_to_uniform` of ``blocks.0.attn.hook_pattern``
    (``batch head query_pos key_pos``), averaged over heads, prompts and query positions >= 1.

    Raises:
        NopeInterpError / TaskError: the prompts do not fit ``n_ctx`` or the task has too few prompts; NaN/inf
            or near-zero activations at a site (the message names the site).
    """
    n_layers = model.cfg.n_layers
    names = {hook_name("pattern", 0)}
    names |= {hook_name(p, layer) for layer in range(n_layers) for p in SCORED_POINTS}
    tokens = task.analysis_tokens(n_prompts, seed)
    if tokens.shape[-1] > model.cfg.n_ctx:
        raise NopeInterpError(f"{task.name} prompts have {tokens.shape[-1]} tokens, more than n_ctx={model.cfg.n_ctx}")
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, return_type=None)
    causal = model.cfg.attention_dir == "causal"
    entropy = float(relative_entropy_to_uniform(cache[hook_name("pattern", 0)], causal,
                                                attention_window(model.cfg, 0))[..., 1:].mean())
    scores = []
    for layer in range(n_layers):
        for point in SCORED_POINTS:
            site = hook_name(point, layer)
            act = cache[site].flatten(-2) if point == "z" else cache[site]
            score = adjacency_score_of_activations(act, what=f"activations at {site}")
            scores.append(SiteScore(site, float(score.nanmean())))
    return entropy, tuple(scores)


def summarize(rows: tuple[GridRow, ...] | list[GridRow]) -> tuple[GridSummary, ...]:
    """Statistics over seeds (:func:`nope_interp.stats.mean_std_ci`) of every score, per grid point and
    task, in the order the points first appear in ``rows``."""
    groups: dict[tuple[Any, ...], list[GridRow]] = defaultdict(list)
    for r in rows:
        groups[(r.grid, r.task, r.n_layers, r.d_model, r.init_mean, r.init_std)].append(r)
    out = []
    for (grid, task, n_layers, d_model, mean, std), rs in groups.items():
        sites = rs[0].sites
        out.append(GridSummary(
            grid=grid, task=task, n_layers=n_layers, d_model=d_model, init_mean=mean, init_std=std, n_seeds=len(rs),
            l0_relative_entropy=mean_std_ci([r.l0_relative_entropy for r in rs]),
            scores=tuple(SiteStats(site, mean_std_ci([r.score(site) for r in rs])) for site in sites)))
    return tuple(out)


def run(config: InitGridConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> InitGridResult:
    """Build and measure (:func:`measure`) the model of every grid point and seed on every task, then
    summarise over seeds. ``log`` gets one line per model.

    Raises:
        NopeInterpError: ``models`` given (this job builds its own); prompts that do not fit a model; a grid
            model larger than the free memory (:func:`~nope_interp.model.check_model_fits`, before any work).
    """
    if models is not None:
        raise NopeInterpError("init-grid builds its own models: run it with models=None")
    for p in grid_points(config):  # refuse a grid point too large for this machine before any work
        check_model_fits(p.model_config(config.n_heads, 0), what=f"init-grid model {p.n_layers}x{p.d_model}")
    steps = [(p, seed) for p in grid_points(config) for seed in range(config.seeds)]
    task_objs = [tasks_pkg.get_task(t) for t in config.tasks]
    rows: list[GridRow] = []
    t0 = time.perf_counter()
    for done, (p, seed) in enumerate(progress(steps, NAME, log), start=1):
        model = build_model(p.model_config(config.n_heads, seed))
        for task in task_objs:
            entropy, scores = measure(model, task, config.n_prompts, seed)
            rows.append(GridRow(grid=p.grid, task=task.name, n_layers=p.n_layers, d_model=p.d_model,
                                init_mean=p.init_mean, init_std=p.init_std, seed=seed,
                                l0_relative_entropy=entropy, scores=scores))
        del model
        emit(log, f"[{done}/{len(steps)}] {p.grid} grid: {p.n_layers}x{p.d_model}, N({p.init_mean}, {p.init_std}), "
                  f"seed {seed} ({time.perf_counter() - t0:.0f}s)")
    return InitGridResult(config=config, rows=tuple(rows), summary=summarize(rows), provenance=io.provenance(),
                          wall_time_s=round(time.perf_counter() - t0, 1))


def fmt_seed_stats(st: SeedStats, digits: int = 2) -> str:
    """``mean±std`` over seeds with ``digits`` decimals (no spaces: a heatmap cell); the mean alone for one seed,
    whose spread is undefined (``mean_std_ci`` gives 0.0 for it): :func:`~nope_interp.stats.fmt_mean_std`, as
    ``compare``'s tables show it (before 2026-12-03 one seed read ``±0.00``)."""
    return fmt_mean_std(st.mean, st.std, st.n_seeds, digits, sep="±")


def plot_grid(result: InitGridResult, grid: str, site: str = hook_name("z", 0)) -> go.Figure:
    """Heatmaps of the mean adjacency score at ``site`` over one grid, one panel per task.

    ``grid="init"``: rows init std, columns init mean. ``grid="size"``: rows depth, columns width. Cells
    show mean ± std over seeds (:func:`fmt_seed_stats`: the mean alone for one seed); a cell whose models have
    no such layer is empty. Colour scale fixed to [0, 1] (0.5 = chance).

    Raises:
        NopeInterpError: ``grid`` not ``"init"`` or ``"size"``, or no row of that grid in the result.
    """
    check_choice("grid", grid, GRIDS)
    rows = [r for r in result.summary if r.grid == grid]
    if not rows:
        raise NopeInterpError(f"no rows for grid {grid!r}")
    ykey, xkey = ("init_std", "init_mean") if grid == "init" else ("n_layers", "d_model")
    task_names = list(dict.fromkeys(r.task for r in rows))
    fig = make_subplots(rows=1, cols=len(task_names), subplot_titles=task_names, horizontal_spacing=0.06)
    ys = sorted({getattr(r, ykey) for r in rows})
    xs = sorted({getattr(r, xkey) for r in rows})
    for c, t in enumerate(task_names, start=1):
        cell = {(getattr(r, ykey), getattr(r, xkey)): r.stats(site) for r in rows if r.task == t}
        z = [[None if cell.get((y, x)) is None else cell[(y, x)].mean for x in xs] for y in ys]
        text = [["" if (st := cell.get((y, x))) is None else fmt_seed_stats(st) for x in xs] for y in ys]
        fig.add_trace(go.Heatmap(z=z, x=[str(x) for x in xs], y=[str(y) for y in ys], zmin=0, zmax=1,
                                 colorscale="Viridis", text=text, texttemplate="%{text}", showscale=(c == 1),
                                 colorbar={"title": "adjacency"}), row=1, col=c)
        fig.update_xaxes(title_text=xkey, type="category", row=1, col=c)
        fig.update_yaxes(title_text=ykey if c == 1 else None, type="category", row=1, col=c)
    spread = "one seed" if {r.n_seeds for r in rows} == {1} else "mean ± std over seeds"
    # at least 640 pixels: one task's 380 cut the title off
    fig.update_layout(title=f"{grid} grid: adjacency score at {site}<br><sup>{spread}; 0.5 = chance</sup>",
                      width=max(640, 380 * len(task_names)), height=480)
    return fig


def plot_entropy_vs_score(result: InitGridResult, site: str = hook_name("z", 0)) -> go.Figure:
    """Scatter of every row: layer-0 attention entropy (relative to uniform) against the adjacency score at
    ``site``, one trace per grid (rows without that site are left out)."""
    fig = go.Figure()
    for grid in GRIDS:
        rs = [r for r in result.rows if r.grid == grid and site in r.sites]
        fig.add_trace(go.Scatter(
            x=[r.l0_relative_entropy for r in rs], y=[r.score(site) for r in rs], mode="markers", name=f"{grid} grid",
            text=[f"{r.task} {r.n_layers}x{r.d_model} N({r.init_mean},{r.init_std}) s{r.seed}" for r in rs],
            hovertemplate="%{text}<br>entropy %{x:.3f}<br>score %{y:.3f}"))
    add_chance_line(fig)
    fig.update_layout(title=f"Layer-0 attention entropy (1 = uniform) vs adjacency score at {site}",
                      xaxis_title="relative entropy of layer-0 attention", yaxis_title="adjacency score (row mean)",
                      yaxis_range=[0, 1.05], width=800, height=520)
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: InitGridResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/init_grid/init_grid.json`` (:meth:`InitGridResult.to_dict`), ``init_grid.csv`` (the
    rows), ``init_grid_summary.csv`` (the summary) and ``figures/init_grid/``: a heatmap of each grid at
    ``blocks.0.attn.hook_z`` and ``blocks.0.hook_resid_post``, ``entropy_vs_score.html`` and the ``plotly.min.js``
    the figures load (:func:`~nope_interp.plotting.with_plotlyjs`). Returns every path written, that file last.

    Raises:
        NopeInterpError: a grid with no rows.
    """
    res_dir, fig_dir = io.prepare_outputs(NAME.replace("-", "_"), result, InitGridResult, out_root)
    paths = [io.write_json(res_dir / "init_grid.json", result.to_dict()),
             io.atomic_write_text(res_dir / "init_grid.csv", io.to_csv([r.to_dict() for r in result.rows])),
             io.atomic_write_text(res_dir / "init_grid_summary.csv",
                                  io.to_csv([s.to_dict() for s in result.summary]))]
    for grid in GRIDS:
        for site, label in FIGURE_SITES.items():
            paths.append(save_figure(plot_grid(result, grid, site), fig_dir / f"{grid}_grid_{label}.html"))
    paths.append(save_figure(plot_entropy_vs_score(result), fig_dir / "entropy_vs_score.html"))
    return with_plotlyjs(paths)
