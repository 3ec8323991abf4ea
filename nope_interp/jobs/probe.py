"""``nope-interp probe``: position probes on cosine-similarity features and on Chi et al.'s variance.

For each model (by default, for each task of ``tasks``: a freshly initialised model of ``default_preset``
and the shipped trained model), ``n_prompts`` held-out inputs of its task (``protocol``: full-length prompts
by default, or the ``authors``' or ``window`` inputs of ``tasks.protocol_inputs``), activations at
each hook site, and for every (site, feature, probe, seed) a probe of the token position trained and
scored on held-out sequences, with two chance baselines (:mod:`nope_interp.probing`; the method is in
``docs/method.md``; the variance feature is from Chi et al., "Latent Positional Information is in the
Self-Attention Variance of Transformer Language Models Without Positional Embeddings", ACL 2023).

A noise-input control runs with every probe: for each task and model width, i.i.d. Gaussian activations of
the same shape (:func:`nope_interp.probing.noise_activations`), which carry no position, probed with every
feature, probe and seed. Every feature must fail it (held-out NRMSE at least
:data:`~nope_interp.probing.NOISE_MAX_NRMSE`; chance is 1.0); a feature that passes reads position off its
own construction, and the run says so (``noise_control.leaks`` in ``probe.json``, and a warning line).

Writes ``results/probe/probe.json`` and ``probe.csv`` (one row per model, task, site, feature, probe and
seed; the noise control's rows have model ``noise control (P positions x d_model N)`` and site ``noise``) and
``figures/probe/nrmse_by_site_<probe>.html`` (NRMSE by site for each feature, the chance line at 1.0 and
the shuffled-target baseline).
"""

import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from torch import Tensor

import tasks as tasks_pkg
from nope_interp import io
from nope_interp.activations import collect_activations
from nope_interp.config import (
    PRESETS,
    FrozenConfig,
    check_choice,
    check_choices,
    check_int,
    check_tasks,
    check_used,
    describe_presets,
    opt,
    preset,
)
from nope_interp.errors import NopeInterpError
from nope_interp.hooks import hook_name, short_label
from nope_interp.jobs import JOB_HELP
from nope_interp.jobs.common import (
    Log,
    ModelEntry,
    check_inputs_fit,
    emit,
    entry_from_init,
    entry_tokens,
    hf_random_length,
    job_models,
    locked_write,
    progress,
    protocol_tag,
    refuse_default_only,
    shipped_entries,
    with_protocol,
)
from nope_interp.plotting import line_mode, save_figure, with_plotlyjs
from nope_interp.probing import (
    FEATURES,
    NOISE_MAX_NRMSE,
    PROBES,
    PROFILE_WIDTH,
    ProbeScore,
    fit_position_probe,
    noise_activations,
    position_features,
)
from tasks import DEFAULT_WINDOW

NAME = "probe"
HELP = JOB_HELP[NAME]
TAKES_MODELS = True
DEFAULT_ONLY = ("tasks", "default_preset")  # which default models
TAKES_TEXT = True  # train-text language models: windows of held-out text
TAKES_HF = True  # a Hugging Face model: random tokens of its vocabulary
DEFAULT_MODELS = "for each of --tasks, an initialised model of --default-preset and the shipped trained model"

#: Defaults of the fields whose default depends on ``quick``: (normal, quick).
N_PROMPTS_DEFAULT = (64, 48)
SEEDS_DEFAULT = (2, 1)
PROBES_QUICK = ("ridge",)
#: Text of the ``normaliser`` entry of ``probe.json``.
NORMALISER = "NRMSE = RMSE / std of the held-out targets"
#: Site name of the noise-input control's rows.
NOISE_SITE = "noise"
#: Seed of the noise-input control's activations.
NOISE_SEED = 0


@dataclass(frozen=True)
class ProbeConfig(FrozenConfig):
    """Settings of ``probe``. ``n_prompts``, ``seeds`` and ``probes`` default to None: 64 prompts, 2 seeds and
    both probes, or with ``quick`` 48 prompts, 1 seed and ridge only; a value given explicitly always wins.
    The effective values are :attr:`prompts_used`, :attr:`seeds_used`, :attr:`features_used` and
    :attr:`probes_used`.

    Raises:
        NopeInterpError: an unknown task, preset, feature or probe; ``n_prompts`` outside [8, 100000];
            ``seeds`` outside [1, 1000]; an empty ``sites``; an unknown ``protocol``; ``window`` outside
            [8, 1000000] (the cosine-profile features need at least 7 positions; the other jobs take 3), or set
            without protocol ``window``.
    """

    tasks: tuple[str, ...] = opt(tasks_pkg.TASK_NAMES, "tasks of the default models")
    default_preset: str = opt("paper", f"preset of the default initialised models: {describe_presets()}")
    n_prompts: int | None = opt(None, "held-out prompts per model (default 64; 48 with --quick)")
    sites: tuple[str, ...] | None = opt(
        None, "full hook names (default: hook_embed, attn.hook_z and hook_resid_post of the first and last layer)")
    features: tuple[str, ...] | None = opt(None, f"features (default all): {', '.join(FEATURES)}")
    probes: tuple[str, ...] | None = opt(None, f"probes (default both; ridge with --quick): {', '.join(PROBES)}")
    seeds: int | None = opt(None, "split/probe seeds 0..N-1 (default 2; 1 with --quick)")
    quick: bool = opt(False, "ridge only, 1 seed, 48 prompts (explicit flags win)")
    protocol: str = opt("full", f"inputs of task models: {', '.join(tasks_pkg.PROTOCOLS)} (docs/method.md)")
    window: int = opt(DEFAULT_WINDOW, "characters per input of the window protocol")

    def __post_init__(self) -> None:
        check_tasks(self.tasks)
        check_choice("protocol", self.protocol, tasks_pkg.PROTOCOLS)
        check_int("window", self.window, 8, 1_000_000)
        check_used("window", self.window, DEFAULT_WINDOW, self.protocol == "window", "with {protocol} window")
        check_choice("default_preset", self.default_preset, tuple(PRESETS))
        if self.n_prompts is not None:
            check_int("n_prompts", self.n_prompts, 8, 100_000)
        if self.seeds is not None:
            check_int("seeds", self.seeds, 1, 1000)
        if self.features is not None:
            check_choices("feature", self.features, FEATURES)
        if self.probes is not None:
            check_choices("probe", self.probes, PROBES)
        if self.sites is not None and not self.sites:
            raise NopeInterpError("sites must not be empty (omit it for the default sites)")

    @property
    def prompts_used(self) -> int:
        """Prompts per model: ``n_prompts``, else 64 (48 with ``quick``)."""
        return self.n_prompts if self.n_prompts is not None else N_PROMPTS_DEFAULT[self.quick]

    @property
    def seeds_used(self) -> tuple[int, ...]:
        """Split/probe seeds ``0 .. seeds-1`` (``seeds`` default 2, 1 with ``quick``)."""
        return tuple(range(self.seeds if self.seeds is not None else SEEDS_DEFAULT[self.quick]))

    @property
    def features_used(self) -> tuple[str, ...]:
        """``features``, else every feature of :data:`nope_interp.probing.FEATURES`."""
        return tuple(self.features) if self.features is not None else FEATURES

    @property
    def probes_used(self) -> tuple[str, ...]:
        """``probes``, else both (ridge only with ``quick``)."""
        if self.probes is not None:
            return tuple(self.probes)
        return PROBES_QUICK if self.quick else PROBES


CONFIG = ProbeConfig


@dataclass(frozen=True)
class ProbeRow:
    """One fitted probe: which model, task, site, feature, probe kind and seed, and its held-out scores.

    Attributes:
        task: task name. model: the model's label (``initialised``, ``trained``, a run directory's name,
            ``initialised (<preset>)``).
        site: full TransformerLens hook name. feature: one of :data:`~nope_interp.probing.FEATURES`.
        probe: ``mlp`` or ``ridge``. seed: the split/probe seed.
        score, mean_baseline, shuffled_baseline: held-out :class:`~nope_interp.probing.ProbeScore` of the
            probe, of predicting the training mean, and of the probe trained on shuffled targets.
        inputs: what the model read: its task's inputs under the config's protocol (``full``, ``authors``,
            ``window``), ``text`` (held-out text windows of a language model), ``random`` (random token ids of
            a Hugging Face model) or ``noise`` (the noise control).
    """

    task: str
    model: str
    site: str
    feature: str
    probe: str
    seed: int
    score: ProbeScore
    mean_baseline: ProbeScore
    shuffled_baseline: ProbeScore
    inputs: str = "full"

    def to_dict(self) -> dict[str, Any]:
        """A flat row: the keys above, then ``<probe|mean_baseline|shuffled_baseline>_<nrmse|pearson_r|mae>``, then
        ``probe_converged`` and ``shuffled_baseline_converged`` (whether the fitted probe's optimiser converged)."""
        out: dict[str, Any] = {"task": self.task, "model": self.model, "inputs": self.inputs, "site": self.site,
                               "feature": self.feature, "probe": self.probe, "seed": self.seed}
        for name, sc in (("probe", self.score), ("mean_baseline", self.mean_baseline),
                         ("shuffled_baseline", self.shuffled_baseline)):
            out.update({f"{name}_nrmse": sc.nrmse, f"{name}_pearson_r": sc.pearson_r, f"{name}_mae": sc.mae})
        out.update({"probe_converged": self.score.converged,
                    "shuffled_baseline_converged": self.shuffled_baseline.converged})
        return out


@dataclass(frozen=True)
class ProbeResult:
    """What ``probe`` measured: the settings used, one :class:`ProbeRow` per fitted probe, provenance, the
    wall time in seconds, and the noise-input control's rows (``noise_rows``: model ``noise control
    (P positions x d_model N)``, one control per task, width and input length probed, site ``noise``);
    ``models``: per model probed, its ``model`` label, ``task`` and ``task_params`` (the size it was probed
    on, e.g. ``{"n_digits": 2}``), the ``inputs`` it read and its ``source`` (the run directory, or the
    initialised config)."""

    config: ProbeConfig
    n_prompts: int
    features: tuple[str, ...]
    probes: tuple[str, ...]
    seeds: tuple[int, ...]
    rows: tuple[ProbeRow, ...]
    provenance: dict[str, str | None]
    wall_time_s: float
    noise_rows: tuple[ProbeRow, ...] = ()
    models: tuple[dict[str, Any], ...] = ()

    def noise_leaks(self) -> list[dict[str, Any]]:
        """The (task, model, feature, probe) of the noise control whose NRMSE, averaged over seeds, is below
        :data:`~nope_interp.probing.NOISE_MAX_NRMSE`: features that find position in pure noise (should be
        empty). Each entry: ``{"task", "model", "feature", "probe", "nrmse"}``."""
        by_key: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
        for r in self.noise_rows:
            by_key[(r.task, r.model, r.feature, r.probe)].append(r.score.nrmse)
        return [{"task": t, "model": m, "feature": f, "probe": p, "nrmse": sum(v) / len(v)}
                for (t, m, f, p), v in by_key.items() if sum(v) / len(v) < NOISE_MAX_NRMSE]

    def to_dict(self) -> dict[str, Any]:
        """The contents of ``probe.json``: settings, ``normaliser``, ``rows``, ``noise_control`` (``rows``,
        ``fail_threshold``: the NRMSE every feature must reach on noise, ``leaks``: :meth:`noise_leaks`),
        provenance, ``wall_time_s``."""
        noise = {"description": "i.i.d. Gaussian activations of each task's shape: no position to find",
                 "fail_threshold": NOISE_MAX_NRMSE, "leaks": self.noise_leaks(),
                 "rows": [r.to_dict() for r in self.noise_rows]}
        return {"n_prompts": self.n_prompts, "protocol": self.config.protocol,
                **({"window": self.config.window} if self.config.protocol == "window" else {}),
                "features": list(self.features), "probes": list(self.probes),
                "seeds": list(self.seeds), "normaliser": NORMALISER, "rows": [r.to_dict() for r in self.rows],
                "noise_control": noise, "models": list(self.models), **self.provenance,
                "wall_time_s": self.wall_time_s}


def default_sites(n_layers: int) -> list[str]:
    """``hook_embed``, then ``attn.hook_z`` and ``hook_resid_post`` of the first and the last layer."""
    sites = [hook_name("embed"), hook_name("z", 0), hook_name("resid_post", 0)]
    if n_layers > 1:
        sites += [hook_name("z", n_layers - 1), hook_name("resid_post", n_layers - 1)]
    return sites


def default_models(config: ProbeConfig) -> list[ModelEntry]:
    """For each task of ``config.tasks``: a freshly initialised model of ``config.default_preset`` (label
    ``initialised``) and, where one is shipped, the trained model (label ``trained``).

    Raises:
        NopeInterpError: a shipped model that is missing or corrupt.
    """
    cfg = preset(config.default_preset)
    entries = []
    for name in config.tasks:
        entries.append(entry_from_init(cfg, tasks_pkg.get_task(name), "initialised"))
        entries += [dataclasses.replace(e, label="trained") for e in shipped_entries([name])]
    return entries


def model_label(entry: ModelEntry) -> str:
    """The ``model`` column of a row: ``trained`` for a shipped model, ``initialised (<preset>[-<overrides>])``
    for a model from :func:`~nope_interp.jobs.common.load_models` with ``--init`` (label
    ``init-<preset>-<task>[-<overrides>]``), otherwise the entry's label (a run directory's name). A shipped
    model analysed on another task size is ``trained (on <task><n_digits>)``. :func:`run` refuses models whose
    rows would share a (task, model) key: they would be averaged as one model's seeds."""
    if entry.kind == "pretrained":   # on another task size: "trained (on reversal8)", not a second "trained"
        on = entry.label.partition("-on-")[2]
        return f"trained (on {on})" if on else "trained"
    prefix = "init-"
    if entry.kind == "init" and entry.label.startswith(prefix):
        return f"initialised ({entry.label.removeprefix(prefix).replace(f'-{entry.task.name}', '', 1)})"
    return entry.label


def probe_entry(config: ProbeConfig, entry: ModelEntry) -> list[ProbeRow]:
    """Every (site, feature, probe, seed) row for one model on its task (sites, features, probes and seeds
    as in ``config``), on ``config.prompts_used`` held-out prompts (prompt seed 1, training prompts excluded).

    Raises:
        NopeInterpError: a site that the model has no activation for; prompts longer than ``n_ctx``; inputs
            shorter than the probes' features need (``PROFILE_WIDTH`` + 3 positions; the message names the
            settings that lengthen them).
    """
    name, inputs, tokens = entry_tokens(entry, config.prompts_used, 1, config.protocol, config.window)
    if tokens.shape[1] < PROFILE_WIDTH + 3:  # say which setting makes the inputs longer
        fix = ("use a larger {n_digits}, or {protocol}='window' with {window} >= {least}"
               if entry.kind not in ("text", "hf") else "the model's inputs are that long")
        err = NopeInterpError.naming("{label}: position probes need inputs of at least {need} positions, its {name} "
                                     "{inputs} inputs have {have}: " + fix, label=entry.label, need=PROFILE_WIDTH + 3,
                                     name=name, inputs=inputs, have=tokens.shape[1], least=PROFILE_WIDTH + 4)
        err.config = ProbeConfig  # --window, not an --init model's --model-window
        raise err
    sites = list(config.sites or default_sites(entry.model.cfg.n_layers))
    acts = collect_activations(entry.model, tokens)
    missing = [s for s in sites if s not in acts.labels]
    if missing:
        raise NopeInterpError(f"unknown site(s) {missing}; allowed: {', '.join(acts.labels)}")
    label = model_label(entry)
    rows = []
    for site in sites:
        rows += _probe_rows(config, name, label, site, acts.acts[acts.labels.index(site)], inputs)
    return rows


def _probe_rows(config: ProbeConfig, task: str, label: str, site: str, site_acts: Tensor,
                inputs: str) -> list[ProbeRow]:
    rows = []
    for feature in config.features_used:
        X, y, groups = position_features(site_acts, feature)
        for probe in config.probes_used:
            for seed in config.seeds_used:
                res = fit_position_probe(X, y, groups, probe, seed)
                rows.append(ProbeRow(task=task, model=label, site=site, feature=feature, probe=probe,
                                     seed=seed, score=res["probe"], mean_baseline=res["mean_baseline"],
                                     shuffled_baseline=res["shuffled_baseline"], inputs=inputs))
    return rows


def noise_control(config: ProbeConfig, task: tasks_pkg.Task | str, d_model: int,
                  n_pos: int | None = None) -> list[ProbeRow]:
    """The noise-input control for one task and model width: every feature, probe and seed of ``config``
    on :func:`~nope_interp.probing.noise_activations` of shape ``(prompts_used, n_pos, d_model)`` (``n_pos``
    default ``task.max_prompt_len``; seed :data:`NOISE_SEED`). ``task`` is a Task or, with ``n_pos``, a task
    name such as ``text-nope``. Rows have model ``noise control (P positions x d_model N)`` and site ``noise``; every
    feature should score about 1.0 (chance).

    Raises:
        NopeInterpError: a task whose prompts are too short for the probes; a task name without ``n_pos``.
    """
    if isinstance(task, str) and n_pos is None:
        raise NopeInterpError(f"noise_control: give n_pos with the task name {task!r}")
    name = task if isinstance(task, str) else task.name
    length = n_pos if n_pos is not None else task.max_prompt_len  # type: ignore[union-attr]
    acts = noise_activations(config.prompts_used, length, d_model, seed=NOISE_SEED)
    return _probe_rows(config, name, f"noise control ({length} positions x d_model {d_model})", NOISE_SITE, acts,
                       "noise")


def _headline(rows: Sequence[ProbeRow]) -> str:
    """``"; best: NRMSE 0.31 (cos_profile, mlp at blocks.0.attn.hook_z; 1.0 = chance)"``: the (site, feature,
    probe) of lowest NRMSE, mean over seeds, for the progress line; empty without rows."""
    by_key: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        if not math.isnan(r.score.nrmse):
            by_key[(r.site, r.feature, r.probe)].append(r.score.nrmse)
    if not by_key:
        return ""
    (site, feature, probe), vals = min(by_key.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
    return f"; best: NRMSE {sum(vals) / len(vals):.2f} ({feature}, {probe} at {site}; 1.0 = chance)"


def run(config: ProbeConfig, models: list[ModelEntry] | None = None, *, log: Log = None) -> ProbeResult:
    """Probe every model of ``models`` (default :func:`default_models`) on its task (see the module docstring).

    Raises:
        NopeInterpError: an unknown site; prompts that do not fit a model's ``n_ctx``; inputs too short for the
            probes (:func:`probe_entry`); two models whose rows would share a (task, model) key
            (:func:`model_label`); the models refused by :func:`~nope_interp.jobs.common.job_models`; with
            ``models`` given, ``tasks`` or ``default_preset`` set (they shape the default models only:
            :func:`~nope_interp.jobs.common.refuse_default_only`).
    """
    given = models is not None
    models = job_models("probe", models, lambda: default_models(config))
    keys: dict[tuple[str, str], str] = {}
    for entry in models:   # rows are keyed by (task, model): two models under one key were averaged as seeds
        task_name = entry.task.name if entry.kind not in ("text", "hf") else entry.label
        key = (task_name, model_label(entry))
        if key in keys:
            raise NopeInterpError(f"probe: the models {keys[key]!r} and {entry.label!r} would both be rows of "
                                  f"model {key[1]!r} on {key[0]} (averaged as one model's seeds); give them labels "
                                  "that differ")
        keys[key] = entry.label
    if given:
        refuse_default_only(NAME, config, DEFAULT_ONLY, DEFAULT_MODELS, models)
    check_inputs_fit("probe", models, [config.protocol], config.window)
    t0 = time.perf_counter()
    rows: list[ProbeRow] = []
    noise_rows: list[ProbeRow] = []
    controls: set[tuple[str, int, int]] = set()
    described: list[dict[str, Any]] = []
    for entry in progress(models, "probe", log):
        new = probe_entry(config, entry)
        rows += new
        name = new[0].task if new else entry.task.name
        task_model = entry.kind not in ("text", "hf")
        described.append({"model": model_label(entry), "task": name,
                          "task_params": entry.task.params() if task_model else {},
                          "inputs": new[0].inputs if new else config.protocol,
                          "source": io.json_safe(entry.source)})
        emit(log, f"{name} {model_label(entry)}: {len(new)} probes{_headline(new)} ({time.perf_counter() - t0:.0f}s)")
        d_model = int(entry.model.cfg.d_model)
        if entry.kind in ("text", "hf"):
            n_pos = int(entry.source["text_window"]) if entry.kind == "text" else hf_random_length(entry.model)
        else:  # the length of the protocol's inputs (it depends on the task's size, e.g. n_digits)
            n_pos = tasks_pkg.protocol_length(entry.task, config.protocol, config.window)
        if (name, d_model, n_pos) not in controls:  # one control per shape probed
            controls.add((name, d_model, n_pos))
            noise_rows += noise_control(config, name if entry.kind in ("text", "hf") else entry.task, d_model, n_pos)
    result = ProbeResult(config=config, n_prompts=config.prompts_used, features=config.features_used,
                         probes=config.probes_used, seeds=config.seeds_used, rows=tuple(rows),
                         provenance=io.provenance(), wall_time_s=round(time.perf_counter() - t0, 1),
                         noise_rows=tuple(noise_rows), models=tuple(described))
    unconverged = [r for r in result.rows if r.score.converged is False]
    if unconverged:
        emit(log, f"WARNING: {len(unconverged)} of {len(result.rows)} probes did not converge (their optimiser "
             f"ran out of iterations; rows with probe_converged false), first: {unconverged[0].task} "
             f"{unconverged[0].model} {unconverged[0].site} {unconverged[0].feature} {unconverged[0].probe}")
    leaks = result.noise_leaks()
    if leaks:
        emit(log, "WARNING: noise control: these features find position in pure noise (NRMSE < "
             f"{NOISE_MAX_NRMSE}): " + ", ".join(f"{k['task']} {k['feature']} {k['probe']} {k['nrmse']:.3f}"
                                                  for k in leaks))
    else:
        emit(log, f"noise control: every feature fails on pure noise (NRMSE >= {NOISE_MAX_NRMSE}), as it must")
    return result


_FEATURE_COLORS = dict(zip(FEATURES, ["#d62728", "#ff7f0e", "#1f77b4", "#2ca02c", "#7f7f7f", "#9467bd"], strict=True))


def plot_probe_nrmse(result: ProbeResult, probe: str = "mlp") -> go.Figure:
    """NRMSE (mean over seeds) by site, a line per feature, a panel per (task, model), with the
    shuffled-target baseline (dotted) and chance (predicting the mean) at 1.0.

    Raises:
        NopeInterpError: ``result`` has no rows of ``probe``.
    """
    panels: dict[tuple[str, str], dict[str, dict[str, list[float]]]] = defaultdict(lambda: defaultdict(dict))
    shuffled: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in result.rows:
        if r.probe != probe:
            continue
        key = (r.task, r.model)
        panels[key][r.feature].setdefault(r.site, []).append(r.score.nrmse)
        shuffled[key][r.site].append(r.shuffled_baseline.nrmse)
    if not panels:
        raise NopeInterpError(f"no rows for probe {probe!r}; the result has: {', '.join(result.probes)}")
    keys = sorted(panels)
    fig = make_subplots(rows=len(keys), cols=1, subplot_titles=[f"{t}, {m}" for t, m in keys],
                        vertical_spacing=0.4 / max(2, len(keys)))
    for i, key in enumerate(keys, start=1):
        for feature, by_site in panels[key].items():
            fig.add_trace(go.Scatter(x=[short_label(s) for s in by_site],
                                     y=[sum(v) / len(v) for v in by_site.values()], mode="lines+markers",
                                     name=feature, legendgroup=feature, showlegend=(i == 1),
                                     line={"color": _FEATURE_COLORS[feature]}), row=i, col=1)
        sh = shuffled[key]
        fig.add_trace(go.Scatter(x=[short_label(s) for s in sh], y=[sum(v) / len(v) for v in sh.values()],
                                 mode=line_mode(len(sh)), name="shuffled-target probe", legendgroup="shuffled",
                                 showlegend=(i == 1), line={"color": "black", "dash": "dot"}), row=i, col=1)
        fig.add_hline(y=1.0, line_dash="dash", line_color="gray", row=i, col=1)
        fig.update_yaxes(title_text="NRMSE", range=[0, 1.4], row=i, col=1)
    fig.update_layout(title=f"Position probes ({probe}, {result.config.protocol} inputs): NRMSE on held-out sequences "
                            "(1.0 = predicting the mean)",
                      height=180 + 300 * len(keys), width=1000)
    return fig


@locked_write(NAME.replace("-", "_"))
def write(result: ProbeResult, out_root: str | Path = ".") -> list[Path]:
    """Write ``results/probe/probe.json``, ``results/probe/probe.csv`` and ``figures/probe/nrmse_by_site_<probe>.html``
    for every probe kind, with the ``plotly.min.js`` the figures load (:func:`~nope_interp.plotting.with_plotlyjs`);
    returns the paths. Under a protocol other than ``full`` every name ends in ``_<protocol_tag>``
    (``probe_authors.json``, ``probe_window64.json``), so the outputs of two protocols or window lengths never overwrite
    each other."""
    res_dir, fig_dir = io.prepare_outputs(NAME, result, ProbeResult, out_root)
    tag = protocol_tag(result.config.protocol, result.config.window)
    sfx = f"_{tag}" if tag else ""
    rows = with_protocol([r.to_dict() for r in (*result.rows, *result.noise_rows)], result.config.protocol,
                         result.config.window)
    paths = [io.write_json(res_dir / f"probe{sfx}.json", result.to_dict()),
             io.atomic_write_text(res_dir / f"probe{sfx}.csv", io.to_csv(rows))]
    for probe in result.probes:
        paths.append(save_figure(plot_probe_nrmse(result, probe), fig_dir / f"nrmse_by_site_{probe}{sfx}.html"))
    return with_plotlyjs(io.drop_stale(paths[0], paths, (res_dir, fig_dir)))  # a probe kind not rerun: its figure
