"""``nope-interp trajectory``: adjacency through training. Does training keep, build or erode the pattern?

For each run directory: the weights kept at log-spaced steps (``checkpoints/step_NNNNNN.safetensors``,
written by the trainer; :func:`nope_interp.train.log_spaced_steps`) are loaded one at a time and analysed
like ``analyze`` (row-mean adjacency at every site, mean over prompts), beside the run's evaluation
accuracy (``metrics.jsonl``), and for NoPE models the layer-0 mechanisms at every step (attention entropy
and the causal test of :func:`nope_interp.diagnostics.layer0_interventions`, on the full-length prompts), so
a reader sees when attention collapse or a delimiter code forms. Writes ``results/trajectory/<run>.{json,csv}``
and ``figures/trajectory/<run>.html`` (score vs step, a line per site, the chance line; accuracy vs step; the
mechanisms below).
"""

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.analysis import analyze_model
from nope_interp.checks import in_order, is_int, is_real
from nope_interp.config import FrozenConfig, check_choice, check_int, check_used, opt
from nope_interp.diagnostics import (
    INTERVENTIONS,
    layer0_attention_entropy,
    layer0_interventions,
    layer0_interventions_unsupported,
)
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import ACTIVATION_POINTS, check_points, short_label
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    check_inputs_fit,
    draw_seed,
    emit,
    job_models,
    locked_write,
    progress,
    protocol_tag,
    run_path,
    warn_overwriting_another_model,
    with_protocol,
)
from nope_interp.model import build_model, load_state
from nope_interp.plotting import LINE_COLOURS, add_chance_line, line_colours, line_mode, save_figure, with_plotlyjs
from nope_interp.pretrained import check_settings_stamp
from nope_interp.train import kept_steps
from tasks import DEFAULT_WINDOW

NAME = "trajectory"
HELP = JOB_HELP[NAME]
TAKES_MODELS = True
SOURCES = ("run", "task", "n_digits")  # only run directories keep weights through training
DEFAULT_MODELS = "none: give --run with run directories trained by this version"


@dataclass(frozen=True)
class TrajectoryConfig(FrozenConfig):
    """Settings of ``trajectory``.

    Raises:
        NopeInterpError: counts out of range; an unknown point or protocol; ``window`` outside [3, 1000000]
            (the adjacency score needs 3 positions), or set without protocol ``window``.
    """

    n_prompts: int = opt(64, "prompts analysed at every kept step")
    points: tuple[str, ...] = opt(("embed", "z", "resid_post"), f"hook points: {', '.join(ACTIVATION_POINTS)}")
    protocol: str = opt("full", f"analysis inputs: {', '.join(tasks_pkg.PROTOCOLS)}")
    window: int = opt(DEFAULT_WINDOW, "characters per input of the window protocol")
    prompt_seed: int = opt(1, "seed of the prompt sampler (the same prompts at every step)")
    no_mechanisms: bool = opt(False, "skip the layer-0 mechanisms at every step (attention entropy and the "
                                     "causal test of nope_interp.diagnostics.layer0_interventions)")

    def __post_init__(self) -> None:
        check_int("n_prompts", self.n_prompts, 1, 100_000)
        check_points(self.points)
        check_choice("protocol", self.protocol, tasks_pkg.PROTOCOLS)
        check_int("window", self.window, 3, 1_000_000)
        check_used("window", self.window, DEFAULT_WINDOW, self.protocol == "window", "with {protocol} window")
        check_int("prompt_seed", self.prompt_seed, 0, 2**63 - 1)


CONFIG = TrajectoryConfig


#: The per-step layer-0 measurements of :func:`run` (``RunTrajectory.mechanisms``), all in [0, 1].
MECHANISMS: tuple[str, ...] = ("l0_attention_entropy", *(f"l0_z_score_{k}" for k in INTERVENTIONS))


@dataclass(frozen=True)
class RunTrajectory:
    """One run through training.

    Attributes:
        label: the run's name. task: its task. objective: its training objective.
        steps: the kept steps, ascending. sites: full hook names.
        scores: ``{site: (score at each step)}``, row-mean adjacency in [0, 1], mean over prompts (NaN, null in
            JSON, when every prompt was degenerate).
        eval_steps, eval_acc: the run's evaluation accuracy (exact match in [0, 1]) by step.
        mechanisms: ``{name: (value at each step)}`` for the names of :data:`MECHANISMS` (layer-0 attention
            entropy relative to uniform, and the row-mean score at ``blocks.0.attn.hook_z`` as is and with
            each explanation undone, on full-length prompts), all in [0, 1]; empty when not measured.
        mechanisms_draw_seed: the seed of the interventions' random draws, the same at every step
            (:func:`~nope_interp.jobs.common.draw_seed` of ``label``); None when no mechanism was measured, or
            read from a file written before it was recorded (whose draws used seed 0).
        run: the run's directory, absolute with links resolved (:func:`~nope_interp.jobs.common.run_path`), so a
            result file says which run it measured (two runs of one folder name write the same file name);
            None in files written before 2026-12-04.
    """

    label: str
    task: str
    objective: str
    steps: tuple[int, ...]
    sites: tuple[str, ...]
    scores: dict[str, tuple[float, ...]]
    eval_steps: tuple[int, ...]
    eval_acc: tuple[float, ...]
    mechanisms: dict[str, tuple[float, ...]] = field(default_factory=dict)
    mechanisms_draw_seed: int | None = None
    run: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return {"label": self.label, "task": self.task, "objective": self.objective, "steps": list(self.steps),
                "sites": list(self.sites), "scores": {s: list(v) for s, v in self.scores.items()},
                "eval_steps": list(self.eval_steps), "eval_acc": list(self.eval_acc),
                "mechanisms": {k: list(v) for k, v in self.mechanisms.items()},
                "mechanisms_draw_seed": self.mechanisms_draw_seed, "run": self.run}

    @classmethod
    def from_dict(cls, data: Any) -> "RunTrajectory":
        """The inverse of :meth:`to_dict` (extra keys such as ``config`` are ignored).

        Raises:
            NopeInterpError: a key is missing or of the wrong type; steps that are not strictly increasing
                integers >= 0; sites that differ from the keys of ``scores``; lists of different lengths; a
                score or accuracy that is not a number in [0, 1] (NaN included); ``mechanisms`` (optional:
                files written before it existed have none) that is not ``{name of MECHANISMS: [value in
                [0, 1] at each step]}``; ``mechanisms_draw_seed`` (optional) not null nor an integer in
                [0, 2**63); ``run`` (optional) not null nor a non-empty string.
        """
        def bad(what: str) -> NopeInterpError:
            return NopeInterpError(f"not a trajectory result (as `nope-interp trajectory` writes): {what}")

        if not isinstance(data, dict):
            raise bad(f"a JSON {type(data).__name__}, not an object")
        missing = [k for k in ("label", "task", "objective", "steps", "sites", "scores", "eval_steps", "eval_acc")
                   if k not in data]
        if missing:
            raise bad(f"missing {', '.join(missing)}")
        for key in ("label", "task", "objective"):
            if not isinstance(data[key], str) or not data[key]:
                raise bad(f"{key} must be a non-empty string")
        for key in ("steps", "sites", "eval_steps", "eval_acc"):
            if not isinstance(data[key], list):
                raise bad(f"{key} must be a list")
        if not isinstance(data["scores"], dict):
            raise bad("scores must be an object {site: [score at each step]}")

        def steps_of(key: str) -> tuple[int, ...]:
            values = data[key]
            if not all(is_int(v) and v >= 0 for v in values):
                raise bad(f"{key} must be integers >= 0")
            if any(b <= a for a, b in zip(values, values[1:], strict=False)):
                raise bad(f"{key} must be strictly increasing")
            return tuple(int(v) for v in values)

        def fractions(values: Any, what: str, undefined: bool = False) -> tuple[float, ...]:
            """``undefined``: null (NaN written to JSON: a score of degenerate inputs only) reads as NaN."""
            if not isinstance(values, list) or not all(
                    (undefined and v is None) or (is_real(v) and 0.0 <= v <= 1.0) for v in values):
                raise bad(f"{what} must be a list of numbers in [0, 1]{' or null' if undefined else ''}")
            return tuple(float("nan") if v is None else float(v) for v in values)

        steps, eval_steps = steps_of("steps"), steps_of("eval_steps")
        sites = tuple(data["sites"])
        if not all(isinstance(s, str) for s in sites) or len(set(sites)) != len(sites):
            raise bad("sites must be distinct strings")
        if set(sites) != set(data["scores"]):
            raise bad("the sites and the keys of scores differ")
        scores = {s: fractions(data["scores"][s], f"the scores of {s}", undefined=True) for s in sites}
        eval_acc = fractions(data["eval_acc"], "eval_acc")
        if any(len(v) != len(steps) for v in scores.values()) or len(eval_steps) != len(eval_acc):
            raise bad(f"{data['label']}: scores and steps differ in length")
        raw = data.get("mechanisms", {})
        if not isinstance(raw, dict) or not set(raw) <= set(MECHANISMS):
            raise bad(f"mechanisms must be an object with keys among {', '.join(MECHANISMS)}")
        mechanisms = {k: fractions(raw[k], f"mechanisms[{k!r}]", undefined=k != "l0_attention_entropy")
                      for k in MECHANISMS if k in raw}
        if any(len(v) != len(steps) for v in mechanisms.values()):
            raise bad(f"{data['label']}: mechanisms and steps differ in length")
        seed = data.get("mechanisms_draw_seed")
        if seed is not None and not (is_int(seed) and 0 <= seed < 2**63):
            raise bad(f"mechanisms_draw_seed must be null or an integer in [0, 2**63), got {seed!r}"[:200])
        seed = None if seed is None else int(seed)
        run = data.get("run")
        if run is not None and (not isinstance(run, str) or not run):
            raise bad(f"run must be null or a non-empty string (the run's directory), got {run!r}"[:200])
        return cls(label=data["label"], task=data["task"], objective=data["objective"], steps=steps, sites=sites,
                   scores=scores, eval_steps=eval_steps, eval_acc=eval_acc, mechanisms=mechanisms,
                   mechanisms_draw_seed=seed, run=run)

    def rows(self) -> list[dict[str, Any]]:
        """CSV rows: one per kept step, a column per site, then a column per measured mechanism."""
        return [{"step": st, **{s: self.scores[s][i] for s in self.sites},
                 **{k: v[i] for k, v in self.mechanisms.items()}} for i, st in enumerate(self.steps)]


@dataclass(frozen=True)
class TrajectoryResult:
    """Every run's trajectory, the config and the wall time in seconds."""

    config: TrajectoryConfig
    runs: tuple[RunTrajectory, ...]
    wall_time_s: float

    def to_dict(self) -> dict[str, Any]:
        """``{"config", "runs": [...], "wall_time_s"}``."""
        return {"config": self.config.to_dict(), "runs": [r.to_dict() for r in self.runs],
                "wall_time_s": self.wall_time_s}




def default_models(config: TrajectoryConfig) -> list[ModelEntry]:
    """``trajectory`` has no default model.

    Raises:
        NopeInterpError: always (the message says which option to give).
    """
    raise NopeInterpError.naming("trajectory needs {run} with one or more run directories")


def _checked_run(entry: ModelEntry) -> tuple[dict[int, Path], list[dict[str, Any]]]:
    """The kept steps of ``entry``'s run (step -> weights file) and its metrics, with every kept weights file
    loaded into the run's model once, so a corrupt or mismatched file late in a run fails before any scoring.

    Raises:
        NopeInterpError: as :func:`run`.
    """
    if entry.run is None:
        raise NopeInterpError.naming("{label} is not a trained run; trajectory needs {run} directories",
                                     label=entry.label)
    steps = kept_steps(entry.run.path)
    if not steps:
        raise NopeInterpError(f"{entry.run.path} has no kept weights in {io.TRAJECTORY_DIR}/ (the shipped models, "
                              "seeds and candidates ship their final weights alone, and runs trained before weights "
                              "were kept have none): retrain it with the command in its config.json to trace it")
    past = [s for s in steps if s > entry.run.train_cfg.steps]
    if past:
        raise NopeInterpError(f"{steps[past[0]]} is past the run's {entry.run.train_cfg.steps} training steps: "
                              "not written by this run; remove it")
    metrics = io.read_metrics(entry.run.path / io.METRICS_FILE, numbers=("eval_acc",))
    unknown = [r["step"] for r in metrics if r["eval_acc"] is None]
    if unknown:  # the accuracy curve (and the result's own reader) needs a number at every evaluation
        raise NopeInterpError(f"{entry.run.path / io.METRICS_FILE}: eval_acc is null at step {unknown[0]}"
                              f"{f' and {len(unknown) - 1} more' if len(unknown) > 1 else ''}: the file is damaged")
    model = build_model(entry.model_cfg)
    for path in steps.values():
        check_settings_stamp(path, entry.model_cfg, entry.run.train_cfg, entry.run.path / io.CONFIG_FILE)
        load_state(model, io.load_weights(path), f"the weights {path}")
    return steps, metrics


def run(config: TrajectoryConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> TrajectoryResult:
    """Score every site at every kept step of every run in ``models``. Every run's files are checked before
    the first step is scored.

    Raises:
        NopeInterpError: a model that is not a run directory, or a run that kept no weights; kept weights past
            the run's training steps, corrupt or not of the run's shape; a corrupt ``metrics.jsonl``
            (:func:`nope_interp.io.read_metrics`).
    """
    models = job_models("trajectory", models, lambda: default_models(config))
    t0 = time.perf_counter()
    checked = [_checked_run(entry) for entry in models]  # every file read once before any scoring
    check_inputs_fit("trajectory", models, [config.protocol], config.window)  # a run without kept weights first
    out = []
    for entry, (steps, metrics) in zip(models, checked, strict=True):
        scores: dict[str, list[float]] = {}
        mechanisms: dict[str, list[float]] = {}
        model = build_model(entry.model_cfg)
        tokens = None
        why = layer0_interventions_unsupported(model)
        if not config.no_mechanisms and why is None:
            task = entry.task
            tokens = task.analysis_tokens(config.n_prompts, config.prompt_seed, entry.train_prompts)
        elif not config.no_mechanisms:
            emit(log, f"{entry.label}: the layer-0 mechanisms are not measured: {why}")
        for step, path in progress(steps.items(), f"trajectory {entry.label}", log):
            load_state(model, io.load_weights(path), f"the weights {path}")
            res = analyze_model(model, entry.task, config.n_prompts, seed=config.prompt_seed,
                                points=tuple(config.points), exclude=entry.train_prompts, protocol=config.protocol,
                                window=config.window)
            for site in res.sites:
                scores.setdefault(site, []).append(res.scores["row_mean"][site]["mean"])
            line = ", ".join(f"{short_label(s)} {v[-1]:.3f}" for s, v in scores.items())
            if tokens is not None:
                mechanisms.setdefault(MECHANISMS[0], []).append(layer0_attention_entropy(model, tokens))
                for k, v in layer0_interventions(model, tokens, seed=draw_seed(entry.label)).items():
                    mechanisms.setdefault(f"l0_z_score_{k}", []).append(v)
                line += "; L0 entropy {:.3f}, L0 z with uniform attention / neutral delimiters / both {}".format(
                    mechanisms[MECHANISMS[0]][-1],
                    " / ".join(f"{mechanisms[f'l0_z_score_{k}'][-1]:.3f}" for k in INTERVENTIONS[1:]))
            emit(log, f"{entry.label} step {step}: {line}")
        out.append(RunTrajectory(
            label=entry.label, task=entry.task.name, objective=entry.run.train_cfg.objective, steps=tuple(steps),
            sites=tuple(scores), scores={s: tuple(v) for s, v in scores.items()},
            eval_steps=tuple(r["step"] for r in metrics), eval_acc=tuple(r["eval_acc"] for r in metrics),
            mechanisms={k: tuple(v) for k, v in mechanisms.items()},
            mechanisms_draw_seed=draw_seed(entry.label) if mechanisms else None, run=run_path(entry)))
    return TrajectoryResult(config=config, runs=tuple(out), wall_time_s=round(time.perf_counter() - t0, 1))


#: How :func:`plot_trajectory` draws each mechanism: (legend name, colour, dash).
MECHANISM_STYLE = {
    "l0_z_score_none": ("L0 z as is (full inputs)", "black", "solid"),
    "l0_z_score_uniform_attention": ("L0 z, uniform attention", LINE_COLOURS[0], "dash"),
    "l0_z_score_neutral_delimiters": ("L0 z, neutral delimiters", LINE_COLOURS[1], "dot"),
    "l0_z_score_both": ("L0 z, both undone", LINE_COLOURS[2], "solid"),
    "l0_attention_entropy": ("L0 attention entropy", "gray", "solid"),
}


def plot_trajectory(run_traj: RunTrajectory, protocol: str = "full") -> go.Figure:
    """Top left: adjacency score vs step (log axis; step 0 drawn at 1), a line per site (colour = layer, solid =
    ``hook_z``, dashed = ``resid_post``, dotted = other sites, gray = embeddings), chance at 0.5.
    Top right: evaluation exact match vs step. When the run has ``mechanisms``, a second row: the score at
    ``blocks.0.attn.hook_z`` as is and with each explanation undone (left, chance and the paper's 0.8) and
    layer 0's attention entropy relative to uniform (right), on full-length prompts."""
    mech = run_traj.mechanisms
    rows = 2 if mech else 1
    titles = [f"adjacency score (row mean, {protocol} inputs)", "eval exact match"]
    if mech:
        titles += ["causal test: L0 hook_z with each explanation undone (full inputs)",
                   "L0 attention entropy (1 = uniform)"]
    fig = make_subplots(rows=rows, cols=2, column_widths=[0.65, 0.35], subplot_titles=titles,
                        vertical_spacing=0.14 if mech else 0.08)
    x = [max(1, s) for s in run_traj.steps]
    layers = [int(site.split(".")[1]) for site in run_traj.sites if site.startswith("blocks.")]
    n_colors = max(layers, default=0) + 1
    palette = sample_colorscale("Viridis", [i / max(1, n_colors - 1) * 0.9 for i in range(n_colors)])
    for site in run_traj.sites:
        # one colour per layer (dark = early), one dash per kind of site: 13+ lines stay tellable apart
        layer = int(site.split(".")[1]) if site.startswith("blocks.") else None
        color = "gray" if layer is None else palette[layer]
        dash = "solid" if site.endswith("hook_z") else "dash" if site.endswith("resid_post") else "dot"
        fig.add_trace(go.Scatter(x=x, y=list(run_traj.scores[site]), mode="lines+markers", name=short_label(site),
                                 line={"color": color, "dash": dash}, marker={"color": color},
                                 customdata=list(run_traj.steps), hovertemplate="step %{customdata}: %{y:.3f}"),
                      row=1, col=1)
    add_chance_line(fig, row=1, col=1)
    fig.add_trace(go.Scatter(x=[max(1, s) for s in run_traj.eval_steps], y=list(run_traj.eval_acc),
                             mode="lines+markers", name="eval exact match", line={"color": "black"},
                             marker={"color": "black"}, cliponaxis=False), row=1, col=2)  # 0 and 1: whole markers
    for key, values in mech.items():
        name, color, dash = MECHANISM_STYLE[key]
        col = 2 if key == "l0_attention_entropy" else 1
        # "as is" wide and drawn first: the interventions that change nothing lie on it and stay visible
        width = 6 if key == "l0_z_score_none" else 2
        fig.add_trace(go.Scatter(x=x, y=list(values), mode="lines+markers", name=name,
                                 line={"color": color, "dash": dash, "width": width},
                                 marker={"color": color, "size": 5},
                                 customdata=list(run_traj.steps), hovertemplate="step %{customdata}: %{y:.3f}"),
                      row=2, col=col)
    if mech:
        add_chance_line(fig, row=2, col=1)
        # at the left, where every run is still near 1.0: the label never sits on a line
        fig.add_hline(y=0.8, line_dash="dot", line_color="green", annotation_text="paper: 0.8-1.0",
                      annotation_position="top left", row=2, col=1)
    fig.update_xaxes(type="log", title_text="step (0 drawn at 1)")
    fig.update_xaxes(type="linear", title_text="step", row=1, col=2)   # evaluations start after step 0: linear
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(title=f"{run_traj.label} ({run_traj.task}, {run_traj.objective} objective): "
                            "adjacency through training", width=1150, height=900 if mech else 560,
                      legend={"orientation": "h", "yanchor": "top", "y": -0.12 if mech else -0.22, "x": 0})
    return fig


def load_trajectory(path: str | Path) -> RunTrajectory:
    """One run's trajectory from the ``results/trajectory/<run>.json`` that :func:`write` wrote.

    Raises:
        NopeInterpError: the file is missing or not such a result.
    """
    return RunTrajectory.from_dict(io.read_json(path, "trajectory result"))


OBJECTIVE_DASH = {"answer_only": "solid", "packed": "dash"}


def plot_site_by_objective(runs: list[RunTrajectory] | tuple[RunTrajectory, ...],
                           site: str = "blocks.0.attn.hook_z") -> go.Figure:
    """One site through training, every run side by side: a column per task, the adjacency score (row mean, in
    [0, 1]; chance 0.5; the paper's 0.8 as a dotted line) on top and eval exact match below, a line per run
    (dash = objective: solid answer-only, dashed packed; colours distinct within a task's column). Step 0 is
    drawn at 1 (log axis).

    Raises:
        NopeInterpError: no runs, or a run without ``site``; ``runs`` a set or frozenset (the lines and colours
            follow its order: :func:`~nope_interp.checks.in_order`; a generator is read once: before, the check of
            ``site`` used it up and the figure was empty).
    """
    runs = in_order("runs", runs, "RunTrajectory results", "plot_site_by_objective")
    if not runs:
        raise NopeInterpError("plot_site_by_objective needs at least one trajectory")
    missing = [r.label for r in runs if site not in r.scores]
    if missing:
        raise NopeInterpError(f"{site} was not analysed in {', '.join(missing)}")
    task_names = list(dict.fromkeys(r.task for r in runs))
    fig = make_subplots(rows=2, cols=len(task_names), shared_xaxes=True, row_heights=[0.62, 0.38],
                        vertical_spacing=0.08, horizontal_spacing=0.06,
                        subplot_titles=[f"{t}: {short_label(site)} adjacency score" for t in task_names]
                        + [f"{t}: eval exact match" for t in task_names])
    # colours are distinct within a task's column (the panels the lines share): one palette over every run gave
    # each task a narrow slice of hues, so that 51 runs read as a few colours per panel
    per_task = {t: [i for i, r in enumerate(runs) if r.task == t] for t in task_names}
    colour = {i: c for idx in per_task.values() for i, c in zip(idx, line_colours(len(idx)), strict=True)}
    for i, r in enumerate(runs):
        col = task_names.index(r.task) + 1
        line = {"color": colour[i], "dash": OBJECTIVE_DASH.get(r.objective, "dot")}
        name = f"{r.label} ({r.objective})"
        fig.add_trace(go.Scatter(x=[max(1, s) for s in r.steps], y=list(r.scores[site]), mode="lines+markers",
                                 name=name, legendgroup=r.label, line=line, customdata=list(r.steps),
                                 hovertemplate=f"{r.label}<br>step %{{customdata}}: %{{y:.3f}}<extra></extra>"),
                      row=1, col=col)
        fig.add_trace(go.Scatter(x=[max(1, s) for s in r.eval_steps], y=list(r.eval_acc),
                                 mode=line_mode(len(r.eval_steps)), cliponaxis=False,  # markers at 0 or 1 whole
                                 name=name, legendgroup=r.label, showlegend=False, line=line,
                                 customdata=list(r.eval_steps),
                                 hovertemplate=f"{r.label}<br>step %{{customdata}}: exact match %{{y:.3f}}"
                                               "<extra></extra>"),
                      row=2, col=col)
    for col in range(1, len(task_names) + 1):
        add_chance_line(fig, row=1, col=col)
        fig.add_hline(y=0.8, line_dash="dot", line_color="green", annotation_text="paper: 0.8-1.0",
                      annotation_position="top left", row=1, col=col)
    fig.update_xaxes(type="log")
    fig.update_xaxes(title_text="training step (0 drawn at 1)", row=2)
    lowest = min((v for r in runs for v in r.scores[site] if not math.isnan(v)), default=0.4)  # NaN: undefined
    fig.update_yaxes(range=[min(0.4, lowest - 0.05), 1.02], row=1)  # never hides a score below 0.4
    fig.update_yaxes(range=[0, 1.02], row=2)
    # the legend (a line per run, about four to a row at the drawn width) gets its own bottom margin, so that
    # the panels keep their height however many runs there are (45 runs squeezed them to a third of the figure)
    legend_px = 26 * math.ceil(len(runs) / 4)
    fig.update_layout(title=f"Adjacency at {site} through training, by task and objective", width=1150,
                      height=640 + legend_px, margin={"t": 90, "b": 80 + legend_px},
                      legend={"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0, "x": 0})
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: TrajectoryResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/trajectory/<run>.json`` and ``.csv`` and ``figures/trajectory/<run>.html``; with more than one
    run also ``figures/trajectory/compare_<site>.html`` (:func:`plot_site_by_objective`) for layer 0's ``hook_z``, when
    every run has it; also the ``plotly.min.js`` the figures load (:func:`~nope_interp.plotting.with_plotlyjs`). Under a
    protocol other than ``full`` every name ends in ``_<protocol_tag>`` (``<run>_authors.json``), so the outputs of two
    protocols never overwrite each other; a file written before for another run directory of the same folder name
    is overwritten with a :class:`~nope_interp.errors.NopeInterpWarning` naming both."""
    res_dir, fig_dir = io.prepare_outputs(NAME, result, TrajectoryResult, out_root)
    for r in getattr(result, "runs", ()):
        # what load_trajectory would refuse is not written (steps shorter than the scores: the CSV dropped
        # steps silently and the JSON could not be read back)
        try:
            RunTrajectory.from_dict(io.json_safe(r.to_dict()))
        except (NopeInterpError, AttributeError) as err:
            raise NopeInterpError(f"trajectory write: the run {getattr(r, 'label', r)!r} is not a consistent "
                                  f"trajectory ({err}); nothing was written") from None
    tag = protocol_tag(result.config.protocol, result.config.window)
    sfx = f"_{tag}" if tag else ""
    paths = []
    for r in result.runs:
        warn_overwriting_another_model(res_dir / f"{r.label}{sfx}.json", "run", r.run, NAME)
        paths += [io.write_json(res_dir / f"{r.label}{sfx}.json", {**r.to_dict(), "config": result.config.to_dict(),
                                                                   **io.provenance()}),
                  io.atomic_write_text(res_dir / f"{r.label}{sfx}.csv", io.to_csv(
                      with_protocol(r.rows(), result.config.protocol, result.config.window))),
                  save_figure(plot_trajectory(r, result.config.protocol), fig_dir / f"{r.label}{sfx}.html")]
    site = "blocks.0.attn.hook_z"
    combined = fig_dir / f"compare_{site}{sfx}.html"
    if len(result.runs) > 1 and all(site in r.scores for r in result.runs):
        paths.append(save_figure(plot_site_by_objective(result.runs, site), combined))
    else:  # never leave the combined figure of an earlier call's runs beside these results
        combined.unlink(missing_ok=True)
    return with_plotlyjs(paths)
