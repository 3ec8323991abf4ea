"""``nope-interp averaging``: the averaging-effect checks on initialised, trained and control models.

For each task: a freshly initialised NoPE model of the paper's shape, a bidirectional NoPE control of
the same shape (initialised; no causal averaging) and the shipped trained model (when the task has
one), on ``n_prompts`` held-out inputs of the task under ``protocol`` (full-length prompts by default, or
the ``authors``' or ``window`` inputs of ``tasks.protocol_inputs``; a trained model's training prompts
excluded). Each is measured with :func:`~nope_interp.averaging_checks.averaging_report` (pattern-predicted vs
observed cosines, attention entropy, the sqrt(i/k) closed form, the 1/k variance of Chi et al., ACL
2023) and :func:`~nope_interp.averaging_checks.counterfactual_report` (layer 0's pattern replaced by
uniform, identity or entropy-matched random attention, the random draws seeded per model by
:func:`~nope_interp.jobs.common.draw_seed` of ``"<task>/<label>"``; exact match on ``eval_n`` test examples for
the trained model). Method: ``docs/method.md`` ("The averaging effect"). Writes
``results/averaging/averaging.{json,csv}`` and ``figures/averaging/*.html`` (every name suffixed ``_authors`` or
``_window<window>`` under a protocol other than ``full``).
"""

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.averaging import PATTERN_KINDS
from nope_interp.averaging_checks import (
    AveragingReport,
    CosineExample,
    CounterfactualReport,
    averaging_report,
    cosine_example,
    counterfactual_report,
)
from nope_interp.config import FrozenConfig, check_choice, check_int, check_tasks, check_used, opt, preset
from nope_interp.errors import Message, NopeInterpError
from nope_interp.hooks import short_label
from nope_interp.interventions import pattern_kind_unsupported
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    check_inputs_fit,
    check_shapes_fit,
    draw_seed,
    emit,
    entry_from_init,
    entry_from_run,
    eval_prefix,
    job_models,
    locked_write,
    progress,
    protocol_tag,
    refuse_default_only,
    with_protocol,
)
from nope_interp.plotting import add_chance_line, save_figure, with_plotlyjs
from nope_interp.pretrained import available_pretrained, load_pretrained
from tasks import DEFAULT_WINDOW

NAME = "averaging"
HELP = JOB_HELP[NAME]
TAKES_MODELS = False
DEFAULT_MODELS = ("per task: an initialised paper-shape model, a bidirectional control and the shipped "
                  "trained model")
#: Config fields that choose the default models only (refused by ``run`` with models given).
DEFAULT_ONLY = ("tasks",)

#: The layer whose attention pattern the counterfactuals replace and the figures show.
LAYER = 0


@dataclass(frozen=True)
class AveragingConfig(FrozenConfig):
    """Settings of ``averaging``.

    Raises:
        NopeInterpError: an unknown or empty task list; ``n_prompts`` outside [3, 100000] (a rank
            correlation needs 3 positions and the report needs several prompts); ``eval_n`` below 1; an
            unknown ``protocol``; ``window`` outside [3, 1000000] (the adjacency score needs 3 positions), or set
            without protocol ``window``.
    """

    tasks: tuple[str, ...] = opt(tasks_pkg.TASK_NAMES, "tasks to measure")
    n_prompts: int = opt(64, "prompts per model (at least 3)")
    eval_n: int = opt(500, "test examples for the exact match under each intervention (trained models)")
    protocol: str = opt("full", f"analysis inputs: {', '.join(tasks_pkg.PROTOCOLS)} (docs/method.md)")
    window: int = opt(DEFAULT_WINDOW, "characters per input of the window protocol")

    def __post_init__(self) -> None:
        check_tasks(self.tasks)
        check_int("n_prompts", self.n_prompts, 3, 100_000)
        check_int("eval_n", self.eval_n, 1)
        check_choice("protocol", self.protocol, tasks_pkg.PROTOCOLS)
        check_int("window", self.window, 3, 1_000_000)
        check_used("window", self.window, DEFAULT_WINDOW, self.protocol == "window", "with {protocol} window")


CONFIG = AveragingConfig


@dataclass(frozen=True)
class ModelAveraging:
    """Every measurement of one model on one task.

    Attributes:
        label: ``initialised``, ``bidirectional_control``, ``trained`` (or the label of a given model).
        kind: ``"init"``, ``"pretrained"`` or ``"run"`` (:class:`~nope_interp.jobs.common.ModelEntry`).
        causal: whether the model's attention is causal (figures are drawn for causal models only).
        averaging: the per-layer measurements. counterfactual: layer ``LAYER``'s pattern replaced.
        example: predicted and observed cosine matrices of layer ``LAYER`` on one prompt (for the figure).
    """

    label: str
    kind: str
    causal: bool
    averaging: AveragingReport
    counterfactual: CounterfactualReport
    example: CosineExample

    def to_dict(self) -> dict[str, Any]:
        """``{"averaging": ..., "counterfactual": ...}`` (the example matrices are figure-only)."""
        return {"averaging": self.averaging.to_dict(), "counterfactual": self.counterfactual.to_dict()}


@dataclass(frozen=True)
class TaskAveraging:
    """The models measured on one task, in order."""

    task: str
    models: tuple[ModelAveraging, ...]

    def model(self, label: str) -> ModelAveraging | None:
        """The model ``label``, or None if it was not measured (e.g. no shipped trained model)."""
        return next((m for m in self.models if m.label == label), None)


@dataclass(frozen=True)
class AveragingResult:
    """What ``averaging`` measured, per task, with provenance and the wall time in seconds."""

    config: AveragingConfig
    tasks: tuple[TaskAveraging, ...]
    provenance: dict[str, str | None]
    wall_time_s: float

    def task(self, name: str) -> TaskAveraging:
        """The measurements of task ``name``.

        Raises:
            NopeInterpError: the task was not measured.
        """
        for t in self.tasks:
            if t.task == name:
                return t
        raise NopeInterpError(f"task {name!r} was not measured; measured: {', '.join(t.task for t in self.tasks)}")

    def to_dict(self) -> dict[str, Any]:
        """The contents of ``averaging.json``: ``{"n_prompts", "eval_n", "protocol", ["window",] "tasks": {task:
        {label: model}}, <provenance>, "wall_time_s"}``."""
        return {"n_prompts": self.config.n_prompts, "eval_n": self.config.eval_n, "protocol": self.config.protocol,
                **({"window": self.config.window} if self.config.protocol == "window" else {}),
                "tasks": {t.task: {m.label: m.to_dict() for m in t.models} for t in self.tasks},
                **self.provenance, "wall_time_s": self.wall_time_s}

    def csv_rows(self) -> list[dict[str, Any]]:
        """The rows of ``averaging.csv``: per task and model, one row per layer (heads concatenated), then
        one row per counterfactual condition (``adjacency@<hook>`` columns, and ``pattern_seed``, the seed of its
        random replacement patterns: empty where no random kind ran)."""
        rows: list[dict[str, Any]] = []
        for t in self.tasks:
            for m in t.models:
                for lay in m.averaging.layers:
                    rows.append({"task": t.task, "model": m.label, "layer": lay.layer,
                                 "spearman_pred_obs": lay.heads_concat.spearman_pred_obs,
                                 "adjacency_predicted": lay.heads_concat.adjacency_predicted,
                                 "adjacency_observed": lay.heads_concat.adjacency_observed,
                                 "relative_entropy": lay.relative_entropy, "closed_form_mae": lay.closed_form_mae,
                                 "variance_vs_1_over_k_spearman": lay.variance_vs_1_over_k_spearman,
                                 "z_identity_max_abs_err": lay.z_identity_max_abs_err})
                for cond in m.counterfactual.conditions:
                    rows.append({"task": t.task, "model": m.label, "condition": cond.kind,
                                 "exact_match": cond.exact_match,
                                 **{f"adjacency@{s}": v for s, v in cond.scores.items()},
                                 "pattern_seed": m.counterfactual.pattern_seed})
        return rows


def task_models(task_name: str) -> list[ModelEntry]:
    """The default models of one task: ``initialised`` (paper shape), ``bidirectional_control`` (paper shape,
    bidirectional attention) and ``trained`` (the shipped model, if the task has one)."""
    task = tasks_pkg.get_task(task_name)
    entries = [entry_from_init(preset("paper"), task, "initialised"),
               entry_from_init(preset("paper", attention="bidirectional"), task, "bidirectional_control")]
    if task_name in available_pretrained():
        entries.append(entry_from_run(load_pretrained(task_name), "trained", "pretrained"))
    return entries


def _default_shapes(task_name: str) -> list[tuple[str, int]]:
    """(label, n_ctx) of each of :func:`task_models`, read without building a model or loading weights."""
    from nope_interp.pretrained import PRETRAINED_DIR, parse_run_config

    shapes = [("initialised", preset("paper").n_ctx), ("bidirectional_control", preset("paper").n_ctx)]
    if task_name in available_pretrained():
        path = PRETRAINED_DIR / task_name / io.CONFIG_FILE
        shapes.append(("trained", parse_run_config(io.read_json(path, "run config"), path)[0].n_ctx))
    return shapes


def default_models(config: AveragingConfig) -> list[ModelEntry]:
    """:func:`task_models` of every task of ``config`` (``run`` builds them one task at a time instead)."""
    return [e for name in config.tasks for e in task_models(name)]


def _eval_examples(entry: ModelEntry, n: int, log: Log = None) -> list[tasks_pkg.Example] | None:
    """The first ``n`` test examples of a trained model's own task (all of them, said in ``log``, when its
    test split is smaller; the report records how many: ``CounterfactualReport.n_eval``), else None."""
    if entry.run is None or entry.run.task != entry.task:
        return None
    test = entry.run.splits.test
    if len(test) < n:
        emit(log, Message.naming("{task} {label}: exact match on all {n_test} test examples ({eval_n} {n} asked for "
                                 "more)", task=entry.task.name, label=entry.label, n_test=len(test), n=n))
    return list(test[:n])


def run(config: AveragingConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> AveragingResult:
    """Measure every model of every task (see the module docstring).

    Args:
        config: the settings.
        models: None (the CLI: :func:`task_models` of each configured task, built one task at a time) or
            models to measure instead, grouped by their task in order of appearance.
        log: receives one line per model.

    Raises:
        NopeInterpError: a model whose inputs do not fit its ``n_ctx``; too few held-out prompts; with ``models``
            given, ``tasks`` set (it chooses the default models only:
            :func:`~nope_interp.jobs.common.refuse_default_only`).
    """
    t0 = time.perf_counter()
    if models is not None:
        models = job_models("averaging", models, lambda: [])
        refuse_default_only(NAME, config, DEFAULT_ONLY, DEFAULT_MODELS, models)
        names = list(dict.fromkeys(e.task.name for e in models))
        groups = {n: [e for e in models if e.task.name == n] for n in names}
        check_inputs_fit(NAME, models, [config.protocol], config.window)
    else:
        names = list(config.tasks)
        groups = {}
        check_shapes_fit(NAME, [(tasks_pkg.get_task(n), f"{n} {label}", n_ctx) for n in names
                                for label, n_ctx in _default_shapes(n)], [config.protocol], config.window)
    out = []
    for name in progress(names, "averaging", log):
        entries = groups[name] if groups else task_models(name)
        measured = []
        for entry in entries:
            task, model = entry.task, entry.model
            inputs = {"protocol": config.protocol, "window": config.window, "exclude": entry.train_prompts}
            try:
                rep = averaging_report(model, task, config.n_prompts, **inputs)
            except NopeInterpError as err:  # e.g. inputs longer than this model's n_ctx: say which model
                raise err.prefixed(f"{name} {entry.label}") from None
            kinds = [k for k in PATTERN_KINDS if pattern_kind_unsupported(model, LAYER, k) is None]
            skipped = {k: pattern_kind_unsupported(model, LAYER, k) for k in PATTERN_KINDS if k not in kinds}
            if skipped:   # one line per model (two lines per control read like errors in a new user's trial)
                heads = {str(v).split(" (")[0] for v in skipped.values()}   # "bidirectional attention", say
                reason = heads.pop() if len(heads) == 1 else "; ".join(f"{k}: {v}" for k, v in skipped.items())
                emit(log, f"{name} {entry.label}: {reason}, so the {' and '.join(skipped)} counterfactual"
                          f"{'s are' if len(skipped) > 1 else ' is'} skipped (causal replacement patterns; "
                          "expected, not an error)")
            cf = counterfactual_report(model, task, LAYER, kinds=kinds, n_prompts=config.n_prompts,
                                       eval_examples=_eval_examples(entry, config.eval_n, log),
                                       prefix=eval_prefix(entry), pattern_seed=draw_seed(f"{name}/{entry.label}"),
                                       **inputs)
            measured.append(ModelAveraging(label=entry.label, kind=entry.kind,
                                           causal=entry.model_cfg.attention == "causal", averaging=rep,
                                           counterfactual=cf, example=cosine_example(model, task, LAYER, **inputs)))
            l0 = rep.layers[0]
            emit(log, f"{name} {entry.label}: L0 entropy {l0.relative_entropy:.3f}, predicted-vs-observed "
                      f"spearman {l0.heads_concat.spearman_pred_obs:.3f}, sqrt(i/k) MAE {l0.closed_form_mae:.3f} "
                      f"({time.perf_counter() - t0:.0f}s)")
        out.append(TaskAveraging(task=name, models=tuple(measured)))
    return AveragingResult(config=config, tasks=tuple(out), provenance=io.provenance(),
                           wall_time_s=round(time.perf_counter() - t0, 1))


def plot_predicted_vs_observed(example: CosineExample, title: str = "") -> go.Figure:
    """Side-by-side heatmaps for one prompt: the cosine matrix predicted from the layer's attention pattern
    (heads summed, i.i.d. values) and the observed cosine matrix of ``hook_z``; scale [-1, 1]."""
    axis = [f"{i}:{c}" for i, c in enumerate(example.prompt)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["predicted from the attention pattern", "observed (hook_z)"])
    for c, m in enumerate((example.predicted, example.observed), start=1):
        fig.add_trace(go.Heatmap(z=m.numpy(), x=axis, y=axis, zmin=-1, zmax=1, zmid=0, colorscale="RdBu_r",
                                 showscale=(c == 2), colorbar={"title": "cosine"}), row=1, col=c)
        fig.update_yaxes(autorange="reversed", title_text="position i (query): character", row=1, col=c)
        fig.update_xaxes(title_text="position j (key): character", tickangle=-45, row=1, col=c)
    fig.update_layout(title=title or f"{example.task}, layer {example.layer}, {example.protocol} inputs: predicted "
                                     "vs observed cosine",
                      width=1300, height=650)
    return fig


#: The model sets :func:`plot_counterfactuals` draws: trained models, or the initialised ones (with the
#: bidirectional control, also initialised), where the paper's explanation is tested.
COUNTERFACTUAL_MODELS = ("trained", "initialised")


def plot_counterfactuals(result: AveragingResult, models: str = "trained") -> go.Figure:
    """Adjacency score by site for each pattern condition, one panel per (task, model) of ``models``:
    ``"trained"`` (every model that is not freshly initialised) or ``"initialised"`` (the initialised models and
    the bidirectional control). One legend entry per condition (the same colour in every panel); each panel's
    title gives its model's exact match under each condition, where a test split exists.

    Raises:
        NopeInterpError: ``models`` not one of :data:`COUNTERFACTUAL_MODELS`.
    """
    if models not in COUNTERFACTUAL_MODELS:
        raise NopeInterpError(f"models must be one of {', '.join(COUNTERFACTUAL_MODELS)}, got {models!r}"[:200])
    panels = [(t.task, m) for t in result.tasks for m in t.models if (m.kind == "init") == (models == "initialised")]

    def title(name: str, m: ModelAveraging) -> str:
        accs = [f"{c.kind} {c.exact_match:.3f}" for c in m.counterfactual.conditions if c.exact_match is not None]
        n_eval = m.counterfactual.n_eval
        over = f" (of {n_eval} examples)" if n_eval is not None else ""
        return f"{name} ({m.label})" + (f": exact match{over} {', '.join(accs)}" if accs else "")

    fig = make_subplots(rows=max(1, len(panels)), cols=1, subplot_titles=[title(name, m) for name, m in panels],
                        vertical_spacing=0.45 / max(2, len(panels)))
    colors = {"clean": "#1f77b4", "uniform": "#2ca02c", "identity": "#d62728", "random_matched": "#9467bd"}
    # each condition its own dash and marker, widest first: conditions that score alike (clean, uniform and
    # random_matched often agree to 0.001) stay visible on top of each other
    styles = {"clean": ("solid", "circle", 12, 5), "uniform": ("dash", "square-open", 10, 3.5),
              "identity": ("dot", "x", 8, 2.5), "random_matched": ("dashdot", "diamond-open", 7, 2)}
    shown: set[str] = set()  # one legend entry per condition, wherever it first appears (a panel may lack some)
    for r, (_, m) in enumerate(panels, start=1):
        for cond in m.counterfactual.conditions:
            sites = list(cond.scores)
            dash, symbol, size, width = styles.get(cond.kind, ("solid", "circle", 8, 2))
            fig.add_trace(go.Scatter(x=[short_label(s) for s in sites], y=[cond.scores[s] for s in sites],
                                     mode="lines+markers", name=cond.kind, legendgroup=cond.kind,
                                     showlegend=cond.kind not in shown,
                                     line={"color": colors.get(cond.kind), "dash": dash, "width": width},
                                     marker={"symbol": symbol, "size": size}),
                          row=r, col=1)
            shown.add(cond.kind)
        add_chance_line(fig, row=r, col=1)
        fig.update_yaxes(range=[0, 1.05], title_text="adjacency score (row mean)", row=r, col=1)
    fig.update_xaxes(tickangle=-60, tickfont={"size": 9})
    fig.update_layout(title=f"Layer-{LAYER} attention replaced: adjacency score by site<br><sup>{models} models, "
                            f"{result.config.protocol} inputs; the sites before layer {LAYER}'s attention do not "
                            "change</sup>",
                      height=200 + 330 * len(panels), width=1100)
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: AveragingResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/averaging/averaging.{json,csv}``, ``figures/averaging/predicted_vs_observed_<task>_<label>.html``
    for every causal model, ``figures/averaging/counterfactual_attention.html`` (when a trained model was measured)
    and ``counterfactual_attention_initialised.html`` (when an initialised one was: the paper's explanation),
    with the ``plotly.min.js`` the figures load (:func:`~nope_interp.plotting.with_plotlyjs`); returns the paths. Under
    a protocol other than ``full`` every name ends in ``_<protocol_tag>`` (``averaging_authors.json``,
    ``averaging_window64.json``), so the outputs of two protocols or window lengths never overwrite each other."""
    res_dir, fig_dir = io.prepare_outputs(NAME, result, AveragingResult, out_root)
    tag = protocol_tag(result.config.protocol, result.config.window)
    sfx = f"_{tag}" if tag else ""
    rows = with_protocol(result.csv_rows(), result.config.protocol, result.config.window)
    paths = [io.write_json(res_dir / f"averaging{sfx}.json", result.to_dict()),
             io.atomic_write_text(res_dir / f"averaging{sfx}.csv", io.to_csv(rows))]
    for t in result.tasks:
        for m in t.models:
            if m.causal:
                title = f"{t.task}, {m.label} model, layer {m.example.layer}, {m.example.protocol} inputs"
                paths.append(save_figure(plot_predicted_vs_observed(m.example, title),
                                         fig_dir / f"predicted_vs_observed_{t.task}_{m.label}{sfx}.html"))
    if any(m.kind != "init" for t in result.tasks for m in t.models):
        paths.append(save_figure(plot_counterfactuals(result), fig_dir / f"counterfactual_attention{sfx}.html"))
    if any(m.kind == "init" for t in result.tasks for m in t.models):
        paths.append(save_figure(plot_counterfactuals(result, "initialised"),
                                 fig_dir / f"counterfactual_attention_initialised{sfx}.html"))
    return with_plotlyjs(io.drop_stale(paths[0], paths, (res_dir, fig_dir)))  # a task or model not rerun: its figures
