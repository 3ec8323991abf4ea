"""``nope-interp length-gen``: length generalisation through the adjacency lens.

Each trained model is asked about operands shorter and longer than it was trained on: for every operand
size ``n_digits`` of ``sizes`` (default: its training size and the sizes around it), ``n_examples``
held-out prompts with operands of exactly that many digits (the task's full-length prompts, none of them a
training prompt), greedy exact match of the whole answer read after the run's own evaluation prefix
(``"\\n"`` for a model trained on packed windows, none for an answer-only model), and, on the first
``n_prompts`` of those prompts read after the same prefix (the tokens the accuracy is measured on; the
prefix's positions are scored too), the adjacency score and the lag profile at every requested site. A NoPE
model runs past its training ``n_ctx`` unchanged (:func:`nope_interp.model.with_context`); a model with
learned positions is refused up front for a size its ``n_ctx`` cannot hold. Does accuracy fall where the
adjacency pattern changes? (``docs/method.md``, "Long contexts").

Default models: the shipped reversal and addition models. Writes
``results/length_gen/{length_gen.json, length_gen.csv}`` and ``figures/length_gen/length_gen.html``.
"""

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.analysis import EXAMPLE_MAX_POS, analyze_tokens
from nope_interp.config import FrozenConfig, check_int, opt
from nope_interp.errors import Fields, NopeInterpError
from nope_interp.evaluate import exact_match_accuracy
from nope_interp.hooks import ACTIVATION_POINTS, check_points, short_label
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    emit,
    eval_prefix,
    job_models,
    locked_write,
    progress,
    run_path,
    shipped_entries,
)
from nope_interp.model import with_context
from nope_interp.plotting import add_chance_line, line_colours, save_figure, with_plotlyjs

NAME = "length-gen"
HELP = JOB_HELP[NAME]
TAKES_MODELS = True
SOURCES = ("run", "pretrained", "with_seeds", "with_candidates")  # trained models only; --sizes sets the operand sizes
DEFAULT_MODELS = "the shipped reversal and addition models"

#: Default operand sizes per task (the paper's training sizes: addition 3, reversal 16, indexing 9,
#: ordering 5 digits).
DEFAULT_SIZES: dict[str, tuple[int, ...]] = {"addition": (1, 2, 3, 4, 5, 6), "reversal": (4, 8, 12, 16, 20, 24, 32),
                                             "indexing": (3, 5, 7, 9, 11, 13), "ordering": (3, 4, 5, 6, 7)}
#: The largest operand size any task allows (reversal); each task allows up to :func:`size_limit`.
MAX_SIZE = 64
#: What the adjacency scores of a row were computed on (recorded in ``length_gen.json``).
SCORED_INPUTS = ("the first n_prompts of the row's exact-match prompts, each read after the row's eval_prefix "
                 "(the tokens the exact match is measured on; the prefix's positions are scored too)")


def size_limit(task_name: str, params: dict[str, Any] | None = None) -> int:
    """The largest ``n_digits`` in [1, :data:`MAX_SIZE`] that task ``task_name`` allows with its other
    ``params`` (0 if none): the upper end of the ``sizes`` it can be asked about."""
    for n in range(MAX_SIZE, 0, -1):
        try:
            tasks_pkg.get_task(task_name, **{**(params or {}), "n_digits": n})
        except tasks_pkg.TaskError:
            continue
        return n
    return 0


def _sizes_message(got: Any) -> str:
    limits = ", ".join(f"{name} {size_limit(name)}" for name in tasks_pkg.TASK_NAMES)
    return f"sizes must be integers in [1, {MAX_SIZE}] (operand digits; the largest per task: {limits}), got {got!r}"


@dataclass(frozen=True)
class LengthGenConfig(FrozenConfig):
    """Settings of ``length-gen``.

    Raises:
        NopeInterpError: a size outside [1, :data:`MAX_SIZE`] (the message names ``sizes`` and each task's
            largest size); ``n_examples`` outside [1, 100000]; ``n_prompts`` outside
            [1, 10000] or above ``n_examples``; an unknown point; an empty points list.
    """

    sizes: tuple[int, ...] = opt((), "operand sizes (n_digits) to test (default per task: around its training size)")
    n_examples: int = opt(500, "prompts scored for exact match per size")
    n_prompts: int = opt(64, "of those, prompts analysed for the adjacency score per size")
    points: tuple[str, ...] = opt(("z", "resid_post"), f"hook points: {', '.join(ACTIVATION_POINTS)}")
    seed: int = opt(1, "seed of the prompt sampler")

    def __post_init__(self) -> None:
        for name in ("sizes", "points"):
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        for s in self.sizes:  # FrozenConfig has checked the type: integers
            if not 1 <= s <= MAX_SIZE:
                raise NopeInterpError(_sizes_message(s))
        object.__setattr__(self, "sizes", tuple(sorted(set(self.sizes))))
        check_int("n_examples", self.n_examples, 1, 100_000)
        check_int("n_prompts", self.n_prompts, 1, 10_000)
        if self.n_prompts > self.n_examples:
            raise NopeInterpError.naming("{n_prompts}={a} exceeds {n_examples}={b}: the prompts analysed are drawn "
                                         "from the prompts scored; lower {n_prompts} or raise {n_examples}",
                                         a=self.n_prompts, b=self.n_examples)
        check_int("seed", self.seed, 0, 2**63 - 1)
        check_points(self.points)


CONFIG = LengthGenConfig


@dataclass(frozen=True)
class LengthRow:
    """One model at one operand size.

    Attributes:
        model: label. task: task name. n_digits: the operand size asked about. trained_n_digits: the size the
            model was trained on. prompt_len: characters of a full-length prompt. exact_match: in [0, 1] over
            ``n_examples`` prompts. scores: ``scores[site] = {"row_mean": {mean, std, n}, "recency_gap": {...}}``
            on the first ``n`` of those prompts, each read after ``eval_prefix`` (:data:`SCORED_INPUTS`).
            eval_prefix: the text read before every prompt, scored and evaluated alike (the run's; ``""`` for
            an answer-only model). run: the model's directory, absolute with links resolved
            (:func:`~nope_interp.jobs.common.run_path`); None in rows built before 2026-12-04.
    """

    model: str
    task: str
    n_digits: int
    trained_n_digits: int
    prompt_len: int
    n_examples: int
    exact_match: float
    scores: dict[str, dict[str, Any]]
    eval_prefix: str = ""
    run: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class LengthGenResult:
    """Every row (model x size) and the wall time in seconds; :meth:`to_dict` also says what the scores
    were computed on (:data:`SCORED_INPUTS`)."""

    config: LengthGenConfig
    rows: tuple[LengthRow, ...]
    wall_time_s: float

    def to_dict(self) -> dict[str, Any]:
        """``{"config", "rows", "scored_inputs", "wall_time_s"}``."""
        return {"config": self.config.to_dict(), "rows": [r.to_dict() for r in self.rows],
                "scored_inputs": SCORED_INPUTS, "wall_time_s": self.wall_time_s}


def default_models(config: LengthGenConfig) -> list[ModelEntry]:
    """The shipped reversal and addition models."""
    return shipped_entries(["reversal", "addition"])


def sizes_for(config: LengthGenConfig, task: tasks_pkg.Task) -> tuple[int, ...]:
    """The sizes asked about for ``task``: the config's, or :data:`DEFAULT_SIZES` of the task."""
    return config.sizes or DEFAULT_SIZES[task.name]


def plan(config: LengthGenConfig, entry: ModelEntry) -> list[tuple[tasks_pkg.Task, int]]:
    """The task at every size ``entry`` is asked about, with the context it needs (its evaluation prefix, a
    full-length prompt, the longest answer and the end of line: what greedy decoding reaches).

    Raises:
        NopeInterpError: an initialised model; a task without ``n_digits``; a size the task does not allow
            (the message names ``sizes`` and the task's range); a model with learned positions whose ``n_ctx``
            cannot hold a size (the message names the model, the size and ``n_ctx``).
    """
    if entry.run is None:
        raise NopeInterpError.naming("{label}: length-gen needs a trained model ({sources})", label=entry.label,
                                     sources=Fields("run", "pretrained", sep=" or "))
    trained = entry.run.task
    if "n_digits" not in trained.params():
        raise NopeInterpError(f"{entry.label}: task {trained.name!r} has no n_digits parameter")
    prefix, cfg = eval_prefix(entry), entry.model_cfg
    out = []
    for size in sizes_for(config, trained):
        try:
            task = tasks_pkg.get_task(trained.name, **{**trained.params(), "n_digits": size})
        except tasks_pkg.TaskError:
            raise NopeInterpError(f"sizes must be integers in [1, {size_limit(trained.name, trained.params())}] for "
                                  f"{trained.name} (model {entry.label}), got {size}") from None
        need = len(prefix) + task.max_prompt_len + task.max_answer_len + 1
        if need > cfg.n_ctx and cfg.positional == "learned":
            fits = [n for n in range(1, size) if len(prefix) + _context(trained, n) <= cfg.n_ctx]
            raise NopeInterpError.naming(
                "{label}: size {size} of {sizes} needs {need} positions ({n_prefix} prefix + {n_prompt} prompt + "
                "{n_answer} answer + 1 end of line), past the model's n_ctx={n_ctx}: it has learned positional "
                "embeddings and none past n_ctx (" + ("{sizes} up to {fit} fit it)" if fits else "no size fits it)"),
                label=entry.label, size=size, need=need, n_prefix=len(prefix), n_prompt=task.max_prompt_len,
                n_answer=task.max_answer_len, n_ctx=cfg.n_ctx, fit=fits[-1] if fits else None)
        out.append((task, need))
    return out


def _context(trained: tasks_pkg.Task, n: int) -> int:
    task = tasks_pkg.get_task(trained.name, **{**trained.params(), "n_digits": n})
    return task.max_prompt_len + task.max_answer_len + 1


def run(config: LengthGenConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> LengthGenResult:
    """Score every model at every size (see the module docstring).

    Raises:
        NopeInterpError: ``models`` an empty list (``None`` means the default models), or no default model
            found; every model and size is then checked by :func:`plan` before any work: an initialised model
            (nothing was trained, so no length was); a task without an ``n_digits`` parameter; a size its task
            does not allow; a model with learned positions asked past its ``n_ctx``.
    """
    models = job_models("length-gen", models, lambda: default_models(config))
    if not models:
        raise NopeInterpError.naming("no models: none of {default} was found; give {sources}", default=DEFAULT_MODELS,
                                     sources=Fields("run", "pretrained", sep=" or "))
    plans = [(entry, plan(config, entry)) for entry in models]  # every model and size checked before any work
    t0 = time.perf_counter()
    rows = []
    for entry, sized in progress(plans, "length-gen", log):
        trained = entry.run.task
        prefix = eval_prefix(entry)
        for task, need in sized:
            size = task.params()["n_digits"]
            exclude = entry.run.train_prompts  # a shorter size's prompts can be training prompts too
            prompts = full_length_prompts(task, config.n_examples, config.seed, exclude)
            examples = [task.example(p) for p in prompts]
            if len(examples) < config.n_examples:   # recorded in the row's n_examples; said here as it happens
                emit(log, f"  {entry.label}: n_digits={size} has only {len(examples)} full-length prompts outside "
                          f"the training prompts (asked for {config.n_examples}); scored on those")
            model, _ = with_context(entry.model, entry.model_cfg, need)
            acc = exact_match_accuracy(model, task, examples, prefix=prefix)
            # scored on the tokens the accuracy is measured on: the prompts after the prefix
            read = [prefix + p for p in prompts[: config.n_prompts]]
            res = analyze_tokens(model, task.prompt_tokens(read), tuple(config.points), task=task.name,
                                 example_prompt=read[0], protocol="full",
                                 forward="hooked" if len(read[0]) <= EXAMPLE_MAX_POS else "auto")
            scores = {site: {"row_mean": res.scores["row_mean"][site],
                             "recency_gap": res.lag_profile[site]["recency_gap"]} for site in res.sites}
            rows.append(LengthRow(model=entry.label, task=task.name, n_digits=size,
                                  trained_n_digits=trained.params()["n_digits"], prompt_len=task.max_prompt_len,
                                  n_examples=len(examples), exact_match=acc, scores=scores, eval_prefix=prefix,
                                  run=run_path(entry)))
            first = res.sites[0]
            after = f" (prompts after {prefix!r})" if prefix else ""
            emit(log, f"  {entry.label:24s} n_digits={size:<3d} exact match {acc:.3f}   {short_label(first)} "
                      f"{scores[first]['row_mean']['mean']:.3f}{after}")
    return LengthGenResult(config=config, rows=tuple(rows), wall_time_s=round(time.perf_counter() - t0, 1))


def full_length_prompts(task: tasks_pkg.Task, n: int, seed: int, exclude: frozenset[str]) -> list[str]:
    """At most ``n`` distinct full-length prompts of ``task`` outside ``exclude``: ``n`` when there are that
    many, else as many as the sampler finds (a small size, e.g. addition with 1-digit operands, has only 100).

    Raises:
        NopeInterpError: not even one such prompt.
    """
    want = min(n, task.n_distinct_prompts())
    while want >= 1:
        try:
            return task.analysis_prompts(want, seed, exclude)
        except tasks_pkg.TaskError:
            want //= 2
    raise NopeInterpError(f"no full-length {task.name} prompt with {task.params()} outside the training prompts")


def plot_length_gen(result: LengthGenResult) -> go.Figure:
    """Per model (a row of panels): exact match by operand size (left) and the adjacency score by size at
    every analysed site (right); the training size is marked by a dashed line."""
    labels = list(dict.fromkeys(r.model for r in result.rows))
    sites = list(dict.fromkeys(site for r in result.rows for site in r.scores))
    colour = dict(zip(sites, line_colours(len(sites)), strict=True))
    # the lowest error bar's end (NaN, undefined, ignored: min() would return it and hide low scores)
    lowest = min((v for r in result.rows for s in r.scores.values()
                  if not math.isnan(v := s["row_mean"]["mean"] - (0.0 if math.isnan(s["row_mean"]["std"])
                                                                  else s["row_mean"]["std"]))), default=0.5)
    fig = make_subplots(rows=len(labels), cols=2, shared_xaxes=False,
                        vertical_spacing=0.35 / len(labels) if len(labels) > 1 else 0.1,
                        subplot_titles=[t for m in labels for t in (f"{m}: exact match", f"{m}: adjacency score")])
    for i, label in enumerate(labels, start=1):
        rows = [r for r in result.rows if r.model == label]
        xs = [r.n_digits for r in rows]
        fig.add_trace(go.Scatter(x=xs, y=[r.exact_match for r in rows], mode="lines+markers", name="exact match",
                                 showlegend=i == 1, line={"color": "black", "dash": "dot"},
                                 marker={"symbol": "square"}), row=i, col=1)
        for site in rows[0].scores:
            fig.add_trace(go.Scatter(x=xs, y=[r.scores[site]["row_mean"]["mean"] for r in rows], mode="lines+markers",
                                     name=short_label(site), legendgroup=site, showlegend=i == 1,
                                     line={"color": colour[site]},
                                     error_y={"type": "data", "visible": True,
                                              "array": [r.scores[site]["row_mean"]["std"] for r in rows]}),
                          row=i, col=2)
        for col in (1, 2):
            fig.add_vline(x=rows[0].trained_n_digits, line_dash="dash", line_color="grey", row=i, col=col)
        fig.update_yaxes(range=[0, 1.02], title_text="exact match", row=i, col=1)
        fig.update_yaxes(range=[max(0.0, min(0.4, lowest - 0.05)), 1.02], title_text="adjacency score (row mean)",
                         row=i, col=2)
        add_chance_line(fig, row=i, col=2)
    fig.update_xaxes(title_text="operand digits (n_digits); dashed: trained")
    fig.update_layout(title="Length generalisation: accuracy and adjacency score by operand length",
                      height=420 * len(labels) + 120, width=1100)
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: LengthGenResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/length_gen/{length_gen.json, length_gen.csv}`` and ``figures/length_gen/length_gen.html``, with
    the ``plotly.min.js`` the figures load (:func:`~nope_interp.plotting.with_plotlyjs`); returns the paths."""
    res_dir, fig_dir = io.prepare_outputs(NAME.replace("-", "_"), result, LengthGenResult, out_root)
    flat = [{"model": r.model, "task": r.task, "n_digits": r.n_digits, "trained_n_digits": r.trained_n_digits,
             "prompt_len": r.prompt_len, "eval_prefix": r.eval_prefix.encode("unicode_escape").decode("ascii"),
             "n_examples": r.n_examples, "exact_match": r.exact_match, "site": site,
             "score_row_mean": s["row_mean"]["mean"], "score_std": s["row_mean"]["std"],
             "recency_gap": s["recency_gap"]["mean"]} for r in result.rows for site, s in r.scores.items()]
    return with_plotlyjs([io.write_json(res_dir / "length_gen.json", result.to_dict()),
                          io.atomic_write_text(res_dir / "length_gen.csv", io.to_csv(flat)),
                          save_figure(plot_length_gen(result), fig_dir / "length_gen.html")])
