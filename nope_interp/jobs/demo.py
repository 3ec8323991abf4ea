"""``nope-interp demo``, the main job: initialised vs trained NoPE models on the four tasks.

For each task: analyse a freshly initialised NoPE model of the paper's shape, the shipped trained model's
own step-0 weights (same config and seed, before any update) and the shipped trained model (or, with
``retrain``, one trained now with the shipped model's recorded configs; with ``from_sweep``, the lowest-seed
model of a finished training sweep, as ``make reproduce`` runs it), re-measure the trained model's
exact match, and put the adjacency scores beside the paper's claims (``docs/method.md``, "Claims").
Writes ``results/demo/summary.{md,json}`` and ``figures/demo/*.html``.
"""

import math
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.analysis import AnalysisResult, analyze_model
from nope_interp.checks import in_order
from nope_interp.config import (
    PRESETS,
    FrozenConfig,
    ModelConfig,
    check_choice,
    check_choices,
    check_int,
    check_tasks,
    check_used,
    describe_presets,
    opt,
    preset,
)
from nope_interp.diagnostics import INTERVENTIONS, diagnose
from nope_interp.errors import NopeInterpError
from nope_interp.evaluate import exact_match_accuracy, exact_match_on_inputs, off_distribution
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    check_inputs_fit,
    draw_seed,
    emit,
    entry_from_run,
    eval_examples,
    job_models,
    locked_write,
    progress,
    protocol_window,
    refuse_default_only,
    resolved_dir,
)
from nope_interp.model import build_model
from nope_interp.plotting import plot_adjacency_by_layer, plot_cosine_heatmaps, save_figure, with_plotlyjs
from nope_interp.pretrained import available_pretrained, load_pretrained, load_run
from nope_interp.stats import fmt_fraction, fmt_mean_std
from nope_interp.train import resolve_device, train
from tasks import DEFAULT_WINDOW

NAME = "demo"
HELP = JOB_HELP[NAME]
TAKES_MODELS = False
DEFAULT_MODELS = "the shipped model of each task"
#: Config fields that choose the default models only (refused by ``run`` with models given).
DEFAULT_ONLY = ("tasks", "retrain", "runs_dir", "device", "from_sweep", "sweep_dir")

#: The paper's claims checked by the demo: (low, high, wording) of the score range claimed.
CLAIMS = {
    "embed": (0.35, 0.65, "about 0.5 (chance) at the token embeddings"),
    "first_attn": (0.8, 1.0, "0.8-1.0 after the first causal attention layer"),
}
#: The sites at which the first-attention claim is checked.
FIRST_ATTENTION_SITES = ("blocks.0.attn.hook_z", "blocks.0.hook_resid_mid", "blocks.0.hook_resid_post")
#: The three models analysed per task, in table order.
MODEL_KINDS = ("initialised", "step0", "trained")


@dataclass(frozen=True)
class DemoConfig(FrozenConfig):
    """Settings of the demo.

    Raises:
        NopeInterpError: unknown task or preset; counts out of range; a bad device; an empty or blank
            ``from_sweep`` or ``sweep_dir``; ``sweep_dir`` without ``from_sweep``.
    """

    tasks: tuple[str, ...] = opt(tasks_pkg.TASK_NAMES, "tasks")
    n_prompts: int = opt(256, "analysis prompts per model (the paper used 256)")
    eval_n: int = opt(2000, "test prompts on which each trained model's exact match is re-measured")
    retrain: bool = opt(False, "train the models again with the shipped recipes (1.5-3 h on 2 CPU cores)")
    runs_dir: str = opt("runs", "where --retrain writes its runs (<runs-dir>/<task>-retrain/)")
    device: str = opt("auto", "device for --retrain: auto, cpu or cuda[:N]")
    from_sweep: str | None = opt(None, "analyse the models of a finished training sweep instead (a spec name or "
                                       "TOML path, as `nope-interp sweep`): per task, its finished point with the "
                                       "lowest seed")
    sweep_dir: str | None = opt(None, "that sweep's output folder (default runs/sweeps/<name>/, as "
                                      "`nope-interp sweep`)")
    init_preset: str = opt("paper", f"shape of the initialised models: {describe_presets()}")
    protocols: tuple[str, ...] = opt(("full", "authors"),
                                     f"analysis inputs to compare, full first: {', '.join(tasks_pkg.PROTOCOLS)}")
    window: int = opt(DEFAULT_WINDOW, "characters per input of the window protocol")

    def __post_init__(self) -> None:
        check_tasks(self.tasks)
        check_choices("protocol", self.protocols, tasks_pkg.PROTOCOLS)
        if self.protocols[0] != "full":
            raise NopeInterpError(f"protocols must start with full (the main tables), got {self.protocols}")
        check_int("window", self.window, 3, 1_000_000)
        check_used("window", self.window, DEFAULT_WINDOW, "window" in self.protocols, "when {protocols} include window")
        check_used("runs_dir", self.runs_dir, "runs", self.retrain, "with {retrain}")
        check_used("device", self.device, "auto", self.retrain, "with {retrain}")
        if not str(self.runs_dir).strip():
            raise NopeInterpError("runs_dir must be a folder path, got an empty one")
        for name, value in (("from_sweep", self.from_sweep), ("sweep_dir", self.sweep_dir)):
            if value is not None:  # an empty one read as not given (the shipped demo) or as the current folder
                io.as_path(value, name)
        if self.from_sweep is not None and self.retrain:
            raise NopeInterpError.naming("{from_sweep} and {retrain} exclude each other: the trained models come from "
                                         "one place")
        if self.sweep_dir is not None and self.from_sweep is None:
            raise NopeInterpError.naming("{sweep_dir} needs {from_sweep} (the spec whose points it holds)")
        check_int("n_prompts", self.n_prompts, 1, 100_000)
        check_int("eval_n", self.eval_n, 1, 10**7)
        check_choice("init_preset", self.init_preset, tuple(PRESETS))
        if not self.retrain and self.from_sweep is None:
            missing = [t for t in self.tasks if t not in available_pretrained()]
            if missing:
                raise NopeInterpError.naming("{tasks}: no shipped model for {missing}; available: {available}",
                                             missing=missing, available=", ".join(available_pretrained()))


CONFIG = DemoConfig


@dataclass(frozen=True)
class Claim:
    """One score beside the paper's claim: ``verdict`` is ``agrees`` when ``score`` is in the claimed range."""

    task: str
    model: str
    site: str
    claim: str
    score: float
    std: float
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        """Plain Python fields (NaN where undefined; strict JSON: :func:`~nope_interp.io.json_safe`)."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class TaskDemo:
    """The demo's measurements on one task.

    Attributes:
        task: task name. analyses: ``{"initialised" | "step0" | "trained": AnalysisResult}`` on full-length
            prompts. other_protocols: ``{protocol: {kind: AnalysisResult}}`` for the other input protocols.
        exact_match_on_inputs: ``{protocol: exact match}`` of the trained model on the analysed inputs
            themselves (:func:`nope_interp.evaluate.exact_match_on_inputs`: the last complete prompt of each
            input, with what precedes it; None when no input holds one), every protocol.
        diagnostics: ``{kind: nope_interp.diagnostics.diagnose(...)}`` on the analysed full-length prompts:
            which mechanism is at work (attention entropy, positional share, value geometry).
        diagnostics_draw_seed: the seed of the diagnostics' random draws (:func:`nope_interp.jobs.common.draw_seed`
            of the trained model's label), shared by the task's three models; None when no diagnostic ran.
        labels: the legend label of each analysed model (shape included).
        trained_model: the trained model's config. objective: its training objective (``answer_only`` or
            ``packed``). train_command, model_source: provenance.
        test_acc_shipped, n_test_shipped, train_steps, train_wall_time_s: from the run's summary (may be None).
        test_acc_remeasured: exact match in [0, 1] on ``n_test_remeasured`` held-out test prompts.
    """

    task: str
    analyses: dict[str, AnalysisResult]
    labels: dict[str, str]
    trained_model: ModelConfig
    objective: str
    train_command: str
    model_source: str
    test_acc_shipped: float | None
    n_test_shipped: int | None
    train_steps: int | None
    train_wall_time_s: float | None
    test_acc_remeasured: float
    n_test_remeasured: int
    other_protocols: dict[str, dict[str, AnalysisResult]]
    exact_match_on_inputs: dict[str, float | None]
    diagnostics: dict[str, dict[str, float]]
    diagnostics_draw_seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The task's entry of ``summary.json``."""
        return {**{k: self.analyses[k].to_dict() for k in MODEL_KINDS},
                "other_protocols": {p: {k: r.to_dict() for k, r in by.items()}
                                    for p, by in self.other_protocols.items()},
                "exact_match_on_inputs": self.exact_match_on_inputs, "diagnostics": self.diagnostics,
                "diagnostics_draw_seed": self.diagnostics_draw_seed,
                "trained_model": self.trained_model.to_dict(), "objective": self.objective,
                "train_command": self.train_command,
                "test_acc_shipped": self.test_acc_shipped, "n_test_shipped": self.n_test_shipped,
                "train_steps": self.train_steps, "train_wall_time_s": self.train_wall_time_s,
                "test_acc_remeasured": self.test_acc_remeasured, "n_test_remeasured": self.n_test_remeasured,
                "model_source": self.model_source}


@dataclass(frozen=True)
class DemoResult:
    """Everything the demo measured: one :class:`TaskDemo` per task and the claims table."""

    config: DemoConfig
    init_model: ModelConfig
    tasks: tuple[TaskDemo, ...]
    claims: tuple[Claim, ...]
    wall_time_s: float
    provenance: dict[str, Any]

    def to_dict(self, figures: list[str] | None = None) -> dict[str, Any]:
        """The contents of ``summary.json`` (``figures``: the paths of the figures written beside it, relative to
        ``summary.json``'s folder)."""
        return {"tasks": {t.task: t.to_dict() for t in self.tasks}, "claims": [c.to_dict() for c in self.claims],
                "n_prompts": self.config.n_prompts, "init_model": self.init_model.to_dict(), **self.provenance,
                "wall_time_s": self.wall_time_s, "figures": list(figures or [])}


def _claims(task: str, label: str, result: AnalysisResult) -> list[Claim]:
    sc = result.scores["row_mean"]
    low, high, text = CLAIMS["embed"]
    sites = [("hook_embed", low, high, text)]
    low, high, text = CLAIMS["first_attn"]
    sites += [(s, low, high, text) for s in result.sites if s in FIRST_ATTENTION_SITES]
    return [Claim(task=task, model=label, site=s, claim=t, score=sc[s]["mean"], std=sc[s]["std"],
                  verdict=claim_verdict(sc[s]["mean"], lo, hi))
            for s, lo, hi, t in sites]


#: The verdict of a claim whose score is undefined (NaN: every input degenerate, no order to score).
UNDEFINED_VERDICT = "undefined (no scored input)"


def claim_verdict(value: float | None, low: float, high: float) -> str:
    """``"agrees"`` when ``value`` is in a claim's range (:func:`in_claimed_range`), ``"DISAGREES"`` when it is
    outside, :data:`UNDEFINED_VERDICT` when it is NaN or None (an undefined score says nothing either way;
    before 2026-12-04 it read as ``DISAGREES``)."""
    if value is None or math.isnan(value):
        return UNDEFINED_VERDICT
    return "agrees" if in_claimed_range(value, low, high) else "DISAGREES"


def in_claimed_range(value: float, low: float, high: float) -> bool:
    """``low <= value <= high`` up to 1e-12, the rounding of a mean (three seeds or prompts at 0.35 average to
    0.34999999999999998): a mean of scores that are all in a claim's range is in it. ``low``, ``high``: a
    range of :data:`CLAIMS`."""
    return low - 1e-12 <= value <= high + 1e-12


def retrain(task: str, runs_dir: str | Path, device: str = "auto", progress_bar: bool = True) -> ModelEntry:
    """Train ``task`` again with the model and training configs of its shipped model, into
    ``runs_dir/<task>-retrain/`` (resumed when a checkpoint is there; skipped when it has finished).

    Raises:
        NopeInterpError: no shipped model for ``task``; a device that is not available.
    """
    shipped = load_pretrained(task)
    run_dir = Path(runs_dir) / f"{task}-retrain"
    if not (run_dir / io.SUMMARY_FILE).exists():
        resume = (run_dir / io.CHECKPOINT_FILE).exists()
        train(shipped.model_cfg, shipped.train_cfg, run_dir, resume=resume, device=resolve_device(device),
              command=f"{shipped.command} (retrained by nope-interp demo --retrain)", progress=progress_bar)
    return entry_from_run(load_run(run_dir), f"{task}-retrain")


def sweep_models(spec: str, tasks: tuple[str, ...], sweep_dir: str | Path = "") -> list[ModelEntry]:
    """The trained model of each task from a finished training sweep (:mod:`nope_interp.sweep`): per task,
    the finished point of the task's default size with the lowest seed (``make reproduce`` runs the
    ``trained-seeds`` sweep, then the demo on its seed-0 models).

    Args:
        spec: a shipped spec name or a TOML path. sweep_dir: its output folder (default
            ``runs/sweeps/<name>/``).

    Raises:
        NopeInterpError: a bad spec; a spec of kind ``init``; a task with no finished point (the message
            gives the command that runs the sweep); ``tasks`` a single string, a set or frozenset (the models
            follow its order: :func:`~nope_interp.checks.in_order`).
    """
    from nope_interp.sweep import finished_result, load_spec

    if isinstance(tasks, (str, bytes)):
        raise NopeInterpError(f"sweep_models: tasks must be a list of task names, got the single string {tasks!r} "
                              f"(write [{tasks!r}] for a list of one)")
    tasks = tuple(in_order("tasks", tasks, "task names", "sweep_models"))

    sp = load_spec(spec)
    if sp.kind != "train":
        raise NopeInterpError(f"sweep {sp.name!r} is of kind {sp.kind!r}: the demo needs trained models "
                              "(a spec of kind 'train', such as trained-seeds)")
    out = Path(sweep_dir) if sweep_dir else Path("runs") / "sweeps" / sp.name
    entries = []
    for task in tasks:
        done = [p for p in sp.points if p.task == task and not p.task_params
                and finished_result(out / "points" / p.key) is not None]
        if not done:
            raise NopeInterpError(f"sweep {sp.name!r} has no finished point of task {task!r} in {out}; run "
                                  f"`nope-interp sweep {shlex.quote(str(spec))}"
                                  + (f" --out-dir {shlex.quote(str(out))}" if sweep_dir else "") + "`")
        best = min(done, key=lambda p: (p.settings["train"]["seed"], p.key))
        seed = best.settings["train"]["seed"]
        entries.append(entry_from_run(load_run(out / "points" / best.key / "run"), f"{task}-{sp.name}-s{seed}"))
    return entries


def default_models(config: DemoConfig) -> list[ModelEntry]:
    """The trained model of each task: the shipped one, a retrained one with ``config.retrain``, or a sweep's
    with ``config.from_sweep`` (:func:`sweep_models`)."""
    if config.from_sweep is not None:
        return sweep_models(config.from_sweep, tuple(config.tasks), config.sweep_dir or "")
    if config.retrain:
        return [retrain(t, config.runs_dir, config.device) for t in config.tasks]
    return [entry_from_run(load_pretrained(t), f"pretrained-{t}", "pretrained") for t in config.tasks]


def run(config: DemoConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> DemoResult:
    """Run the demo on ``models`` (default :func:`default_models`: one trained model per task).

    Raises:
        NopeInterpError: a model whose ``n_ctx`` does not fit its task; with ``models`` given, a field of
            :data:`DEFAULT_ONLY` set (``tasks``, ``retrain``, ... choose the default models only:
            :func:`~nope_interp.jobs.common.refuse_default_only`).
    """
    if models is not None:
        refuse_default_only(NAME, config, DEFAULT_ONLY, DEFAULT_MODELS, job_models(NAME, models, list))
    t_start = time.perf_counter()
    emit(log, f"demo: {len(config.tasks)} task{'s' if len(config.tasks) != 1 else ''}, {config.n_prompts} "
              "prompts per model" + (" (retraining first)" if config.retrain else ""))
    models = job_models("demo", models, lambda: default_models(config))
    check_inputs_fit("demo", models, config.protocols, config.window)
    init_cfg = preset(config.init_preset)
    per_task, claims = [], []
    for i, entry in enumerate(progress(models, "demo", log), start=1):
        t0 = time.perf_counter()
        task, run_ = entry.task, entry.run
        assert run_ is not None, "the demo analyses trained runs"
        n = config.n_prompts
        init_res = analyze_model(build_model(init_cfg), task, n, seed=1, exclude=entry.train_prompts)
        step0_res = analyze_model(build_model(entry.model_cfg), task, n, seed=1, exclude=entry.train_prompts)
        trained_res = analyze_model(entry.model, task, n, seed=1, exclude=entry.train_prompts)
        test = eval_examples(entry, config.eval_n)  # the run's test split on its own task
        prefix = run_.train_cfg.eval_prefix
        acc = exact_match_accuracy(entry.model, task, test, prefix=prefix)
        others: dict[str, dict[str, AnalysisResult]] = {}
        for protocol in config.protocols[1:]:
            others[protocol] = {
                kind: analyze_model(model, task, n, seed=1, exclude=entry.train_prompts, protocol=protocol,
                                    window=protocol_window(protocol, config.window))
                for kind, model in (("initialised", build_model(init_cfg)), ("trained", entry.model))}
        analysed = [task.example(p) for p in task.analysis_prompts(n, 1, entry.train_prompts)]
        on_inputs = {p: exact_match_on_inputs(entry.model, task, tasks_pkg.protocol_inputs(
            task, p, n, 1, entry.train_prompts, protocol_window(p, config.window))).exact_match
            for p in config.protocols}
        tokens = task.prompt_tokens([ex.prompt for ex in analysed])
        draws = draw_seed(entry.label)  # one draw for the task's three models (paired)
        diagnostics = {kind: diagnose(model, task, tokens, seed=draws) for kind, model in
                       (("initialised", build_model(init_cfg)), ("step0", build_model(entry.model_cfg)),
                        ("trained", entry.model))} if len(analysed) > 1 else {}
        m = entry.model_cfg
        analyses = {"initialised": init_res, "step0": step0_res, "trained": trained_res}
        per_task.append(TaskDemo(
            task=task.name, analyses=analyses,
            labels={"initialised": f"initialised ({config.init_preset}, {init_cfg.n_layers}x{init_cfg.d_model})",
                    "step0": f"same shape, step 0 ({m.n_layers}x{m.d_model})",
                    "trained": f"trained ({m.n_layers}x{m.d_model})"},
            trained_model=m, objective=run_.train_cfg.objective, train_command=run_.command,
            model_source=resolved_dir(run_.path),
            test_acc_shipped=run_.summary.get("test_acc"), n_test_shipped=run_.summary.get("n_test"),
            train_steps=run_.summary.get("steps"), train_wall_time_s=run_.summary.get("train_wall_time_s"),
            test_acc_remeasured=acc, n_test_remeasured=len(test), other_protocols=others,
            exact_match_on_inputs=on_inputs, diagnostics=diagnostics,
            diagnostics_draw_seed=draws if diagnostics else None))
        for kind in MODEL_KINDS:
            claims += _claims(task.name, kind, analyses[kind])
        z = "blocks.0.attn.hook_z"
        emit(log, f"[{i}/{len(models)}] {task.name}: embed {init_res.scores['row_mean']['hook_embed']['mean']:.3f} -> "
                  f"L0 hook_z {init_res.scores['row_mean'][z]['mean']:.3f} (initialised), "
                  f"{trained_res.scores['row_mean'][z]['mean']:.3f} (trained); "
                  f"test exact match {_shipped_acc(run_.summary)}, {fmt_fraction(acc)} remeasured on "
                  f"{len(test):,} held-out prompts ({time.perf_counter() - t0:.0f}s)")
    return DemoResult(config=config, init_model=init_cfg, tasks=tuple(per_task), claims=tuple(claims),
                      wall_time_s=round(time.perf_counter() - t_start, 1), provenance=io.provenance())


def _shipped_acc(summary: dict[str, Any]) -> str:
    """The run's own test exact match as its summary records it (``0.9908 on 20,000``), or ``not recorded``."""
    acc, n = summary.get("test_acc"), summary.get("n_test")
    if not isinstance(acc, (int, float)) or isinstance(acc, bool):
        return "not recorded"
    return fmt_fraction(acc) + (f" on {n:,}" if isinstance(n, int) and not isinstance(n, bool) else "")


def plot_cosine(task_demo: TaskDemo, kind: str) -> go.Figure:
    """Cosine heatmaps (slider over sites) of the example prompt for one model (``kind`` in MODEL_KINDS)."""
    res = task_demo.analyses[kind]
    return plot_cosine_heatmaps(
        res.example_sim, res.sites, res.example_prompt,
        f"{task_demo.task}, {kind} NoPE model (full inputs): cosine similarity of {res.example_prompt!r}")


def plot_adjacency(result: DemoResult) -> go.Figure:
    """Adjacency score (row mean, mean ± std) by site: a panel per task, a line per model."""
    return plot_adjacency_by_layer(
        {t.task: {t.labels[k]: t.analyses[k].scores["row_mean"] for k in MODEL_KINDS} for t in result.tasks},
        "Adjacency score (row mean) by hook site, full inputs<br><sup>initialised vs trained NoPE models, mean ± std "
        "over prompts (the other protocols: summary.md)</sup>")


def render_summary(summary: dict[str, Any]) -> str:
    """The Markdown report from the ``summary.json`` dict: accuracy table, claims table, scores by site."""
    lines = ["# nope-interp demo: the adjacency pattern in NoPE models", "",
             f"Adjacency score = row mean (paper's definition) over {summary['n_prompts']} held-out full-length "
             "prompts per task, mean ± std over sequences. The `pooled` reduction (authors' code) is in "
             "summary.json.", "", "## Trained models", "",
             "| task | objective | shape (layers x d_model) | steps | train time (min) | test exact match (shipped, n) "
             "| re-measured (n) | reaches 99% (full test set)? |", "|---|---|---|---|---|---|---|---|"]
    for name, t in summary["tasks"].items():
        m = t["trained_model"]
        shipped = t["test_acc_shipped"]
        wall = t["train_wall_time_s"]
        lines.append(
            f"| {name} | {t.get('objective', 'answer_only')} | {m['n_layers']}x{m['d_model']} | {t['train_steps']} | "
            f"{'' if wall is None else f'{wall / 60:.1f}'} | "
            f"{'n/a' if shipped is None else fmt_fraction(shipped)} ({t['n_test_shipped']}) | "
            f"{fmt_fraction(t['test_acc_remeasured'])} ({t['n_test_remeasured']}) | "
            f"{'yes' if (shipped if shipped is not None else t['test_acc_remeasured']) >= 0.99 else 'NO'} |")
    lines += ["", "## Our numbers beside the paper's claims", "",
              "| task | model | hook | paper claims | ours (mean ± std) | verdict |", "|---|---|---|---|---|---|"]
    for c in summary["claims"]:
        lines.append(f"| {c['task']} | {c['model']} | `{c['site']}` | {c['claim']} | "
                     f"{fmt_mean_std(c['score'], c['std'], summary['n_prompts'])} | {c['verdict']} |")
    lines += ["", "Paper's claim 3 (the pattern holds before and after training on all four tasks) is the "
              "conjunction of the rows above.", "", "## Adjacency score at every hook site", ""]
    for name, t in summary["tasks"].items():
        lines += [f"### {name}", "", "| hook | initialised (paper shape) | same shape as trained, step 0 | trained |",
                  "|---|---|---|---|"]
        cols = [t[k]["scores"]["row_mean"] for k in MODEL_KINDS]
        for site in t["initialised"]["sites"]:
            # one prompt: its spread is undefined, the mean alone (not "± 0.000")
            cells = [fmt_mean_std(c[site]["mean"], c[site]["std"], c[site]["n"]) if site in c else "-" for c in cols]
            lines.append(f"| `{site}` | " + " | ".join(cells) + " |")
        lines += ["", f"Trained with: `{t['train_command']}`", ""]
    others = [(name, t) for name, t in summary["tasks"].items() if t.get("other_protocols")]
    if others:
        z = "blocks.0.attn.hook_z"
        lines += ["## Other input protocols", "",
                  "Row-mean adjacency at `hook_embed` and `" + z + "` under each protocol (`full`: full-length "
                  "held-out prompts; `authors`: test lines cut to a fixed length and left-padded with newlines, as "
                  "the authors' analysis code; `window`: windows of concatenated test lines; see docs/method.md). "
                  "A model trained on single unpadded prompts never saw padding or earlier examples: whether it "
                  "reads these inputs anyway is its exact match on them, below (where it is low, its scores there "
                  "are measured off its distribution).", "",
                  "| task | protocol | initialised embed | initialised L0 hook_z | trained embed | trained L0 hook_z |",
                  "|---|---|---|---|---|---|"]
        for name, t in others:
            rows = [("full", {k: t[k] for k in ("initialised", "trained")}), *t["other_protocols"].items()]
            for protocol, by in rows:
                cells = [f"{by[k]['scores']['row_mean'][s]['mean']:.3f}" for k in ("initialised", "trained")
                         for s in ("hook_embed", z)]
                lines.append(f"| {name} | {protocol} | " + " | ".join(cells) + " |")
        def em(v: float | None, test_acc: float | None) -> str:
            flag = " (off-distribution)" if off_distribution(v, test_acc) else ""
            return ("-" if v is None else format(v, ".3f")) + flag

        lines += ["", "Trained models' greedy exact match on the very inputs analysed (the last complete prompt of "
                  "each input, read with its padding or earlier lines; `nope_interp.evaluate.exact_match_on_inputs`; "
                  "off-distribution: more than 0.1 below the model's test exact match, so its scores there are "
                  "measured on inputs it does not read as trained): "
                  + "; ".join(f"{name} " + ", ".join(f"{p} {em(v, t.get('test_acc_remeasured'))}"
                                                      for p, v in t["exact_match_on_inputs"].items())
                              for name, t in others)
                  + ". `nope-interp compare` adds the authors' statistics (their rounded pooled score and the "
                  "score of the prompt-averaged matrix).", ""]
    diag = [(name, t) for name, t in summary["tasks"].items() if t.get("diagnostics")]
    if diag:
        lines += ["## Which mechanism? Layer-0 diagnostics", "",
                  "Relative entropy of layer-0 attention, mean over heads and its lowest head's (1 = uniform: "
                  "averaging is possible; near 0: attention "
                  "collapsed), the share of the second moment of `blocks.0.attn.hook_z` held by the per-position "
                  "mean (1 = purely positional), the spread of the digits' layer-0 value vectors around their "
                  "centroid (relative to its norm; small = collapsed), the delimiters' value norm relative to "
                  "the digits', and how many directions the digits' values span (participation ratio, at most 9; "
                  "see nope_interp/diagnostics.py).", "",
                  "| task | model | L0 attention entropy | its lowest head's | positional share of L0 hook_z "
                  "| digit value spread | delimiter / digit value norm | digit value participation ratio |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, t in diag:
            for kind, d in t["diagnostics"].items():
                pr = d.get("digit_value_participation_ratio")
                low = d.get("l0_min_head_entropy")  # None in files written before it was measured
                lines.append(f"| {name} | {kind} | {d['l0_attention_entropy']:.3f} | "
                             f"{'-' if low is None else format(low, '.3f')} | {d['l0_z_positional_share']:.3f} "
                             f"| {d['digit_value_spread']:.3f} | {d['delimiter_value_norm_ratio']:.2f} "
                             f"| {'-' if pr is None else format(pr, '.2f')} |")
        if any("l0_z_score_none" in d for _, t in diag for d in t["diagnostics"].values()):
            lines += ["", "Causal check: the row-mean score at `blocks.0.attn.hook_z` with layer 0's attention made "
                      "uniform (undoes any non-uniform attention, collapse among others), with the delimiters' "
                      "layer-0 values resampled from the digits' (removes what the delimiters' values carry, a "
                      "delimiter-keyed code among others), and both (nope_interp.diagnostics.layer0_interventions).",
                      "", "| task | model | as is | uniform attention | neutral delimiters | both |",
                      "|---|---|---|---|---|---|"]
            for name, t in diag:
                for kind, d in t["diagnostics"].items():
                    if "l0_z_score_none" in d:
                        lines.append(f"| {name} | {kind} | " + " | ".join(f"{d['l0_z_score_' + i]:.3f}"
                                                                         for i in INTERVENTIONS) + " |")
        lines.append("")
    lines += ["## Figures", ""] + [f"- [{Path(p).name}]({p})" for p in summary["figures"]]  # relative: links work
    lines += ["", f"Demo wall time: {summary['wall_time_s']} s. Commit: {summary.get('git_commit')}.", ""]
    return "\n".join(lines)


@locked_write(NAME.replace("-", "_"))
def write(result: DemoResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``figures/demo/`` (cosine heatmaps per task and model, the adjacency-by-layer chart) and
    ``results/demo/summary.{json,md}``, with the ``plotly.min.js`` the figures load
    (:func:`~nope_interp.plotting.with_plotlyjs`); returns the paths. ``figures/demo/`` belongs to the demo: heatmaps of
    an earlier run are removed so that the folder matches the summary."""
    res_dir, fig_dir = io.prepare_outputs(NAME, result, DemoResult, out_root)
    for old in fig_dir.glob("cosine_*.html") if fig_dir.is_dir() else []:
        old.unlink()
    figures = [save_figure(plot_cosine(t, kind), fig_dir / f"cosine_{t.task}_{kind}.html")
               for t in result.tasks for kind in MODEL_KINDS]
    figures.append(save_figure(plot_adjacency(result), fig_dir / "adjacency_by_layer.html"))
    summary = result.to_dict(io.relative_to_folder(figures, res_dir))  # from summary.json and summary.md
    return with_plotlyjs([io.write_json(res_dir / "summary.json", summary),
                          io.atomic_write_text(res_dir / "summary.md", render_summary(summary)), *figures])
