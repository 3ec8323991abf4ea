"""The ``nope-interp`` command line: train, analyze, demo, averaging, init-grid, probe, ablate.

Flags for model and training settings are derived from :class:`~nope_interp.model.ModelConfig` and
:class:`~nope_interp.train.TrainConfig` (``--n-layers``, ``--lr``, ...). Bad input prints one line,
``nope-interp: error: ...``, and exits with status 2.
"""

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nope_interp.errors import NopeInterpError
from nope_interp.hooks import ACTIVATION_POINTS
from tasks import TASK_NAMES, TaskError

_MODEL_FLAGS = ("n_layers", "d_model", "n_heads", "d_head", "d_mlp", "n_ctx", "act_fn", "normalization",
                "positional", "attention", "init_mean", "init_std", "seed")
_TRAIN_SKIP = ("task", "task_params")


def _add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, names: Sequence[str], prefix: str = "") -> None:
    for f in dataclasses.fields(cls):
        if f.name not in names:
            continue
        typ = {"int": int, "float": float, "str": str}.get(f.type if isinstance(f.type, str) else f.type.__name__, str)
        parser.add_argument(f"--{prefix}{f.name.replace('_', '-')}", dest=f"{prefix.replace('-', '_')}{f.name}",
                            type=typ, default=None, help=f"(default from the preset/config: {f.default!r})")


def _model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {n: getattr(args, f"model_{n}") for n in _MODEL_FLAGS if getattr(args, f"model_{n}", None) is not None}


def _build_parser() -> argparse.ArgumentParser:
    from nope_interp.model import PRESETS, ModelConfig
    from nope_interp.train import TrainConfig

    parser = argparse.ArgumentParser(prog="nope-interp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a NoPE model on a task; writes runs/<name>/")
    p.add_argument("--task", required=True, help=f"one of: {', '.join(TASK_NAMES)}")
    p.add_argument("--n-digits", type=int, default=None, help="task size (default: the paper's)")
    p.add_argument("--preset", default="cpu", help=f"model preset: {', '.join(PRESETS)} (default cpu)")
    p.add_argument("--name", default=None, help="run name (default: <task>-<preset>-s<seed>)")
    p.add_argument("--runs-dir", default="runs", help="parent of the run directory (default runs/)")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--finalize", action="store_true",
                   help="no training: score a stopped run's last checkpoint on the test set, write summary.json")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_dataclass_flags(p, ModelConfig, _MODEL_FLAGS, prefix="model-")
    _add_dataclass_flags(p, TrainConfig, [f.name for f in dataclasses.fields(TrainConfig) if f.name not in _TRAIN_SKIP])

    p = sub.add_parser("analyze", help="adjacency scores at every hook site + figures for one model")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a run directory (runs/<name>/)")
    src.add_argument("--pretrained", metavar="TASK", help=f"a shipped trained model: {', '.join(TASK_NAMES)}")
    src.add_argument("--init", action="store_true", help="a freshly initialised model (--task, --preset)")
    p.add_argument("--task", default=None, help="task for --init (and to analyse a model on another task)")
    p.add_argument("--n-digits", type=int, default=None, help="task size for --init (default: the paper's)")
    p.add_argument("--preset", default="paper", help=f"model preset for --init: {', '.join(PRESETS)} (default paper)")
    _add_dataclass_flags(p, ModelConfig, _MODEL_FLAGS, prefix="model-")
    p.add_argument("--n-prompts", type=int, default=256, help="prompts analysed (default 256, as the paper)")
    p.add_argument("--points", nargs="+", default=list(ACTIVATION_POINTS),
                   help=f"hook points (default all): {', '.join(ACTIVATION_POINTS)}")
    p.add_argument("--prompt-seed", type=int, default=1, help="seed of the prompt sampler (default 1)")
    p.add_argument("--out-root", default=".", help="writes results/analyze/<label>/ and figures/analyze/<label>/")
    p.add_argument("--label", default=None, help="output label (default from the model source)")

    p = sub.add_parser("demo", help="the main job: initialised vs trained models on all four tasks")
    p.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), help="tasks (default all four)")
    p.add_argument("--n-prompts", type=int, default=256, help="analysis prompts per model (default 256)")
    p.add_argument("--eval-n", type=int, default=2000, help="test prompts to re-measure accuracy (default 2000)")
    p.add_argument("--retrain", action="store_true", help="train the four models again with the shipped recipes")
    p.add_argument("--runs-dir", default="runs", help="where --retrain writes its runs (default runs/)")
    p.add_argument("--device", default="auto", help="device for --retrain: auto, cpu or cuda[:N]")
    p.add_argument("--init-preset", default="paper", help="shape of the initialised models (default paper)")
    p.add_argument("--out-root", default=".", help="writes results/summary.{md,json} and figures/demo/ here")

    p = sub.add_parser("averaging", help="test the averaging-effect explanation against attention patterns")
    p.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), help="tasks (default all four)")
    p.add_argument("--n-prompts", type=int, default=64, help="prompts per model (default 64)")
    p.add_argument("--eval-n", type=int, default=500, help="test prompts for accuracy under interventions")
    p.add_argument("--out-root", default=".", help="writes results/averaging/ and figures/averaging/ here")

    p = sub.add_parser("init-grid", help="adjacency score over init mean x std and depth x width (no training)")
    p.add_argument("--quick", action="store_true", help="a small grid (about 2 minutes on 2 cores)")
    p.add_argument("--wide-std", action="store_true", help="the authors' wider std list 0.0002 ... 2")
    p.add_argument("--seeds", type=int, default=None, help="seeds per grid point (default 5; quick 2)")
    p.add_argument("--n-prompts", type=int, default=None, help="prompts per task (default 32; quick 16)")
    p.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), help="tasks (default all four)")
    p.add_argument("--out-root", default=".", help="writes results/init_grid/ and figures/init_grid/ here")

    p = sub.add_parser("probe", help="position probes: cosine features vs Chi et al.'s variance")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--run", help="probe one run directory (default: every task, initialised and shipped)")
    src.add_argument("--pretrained", metavar="TASK", help="probe one shipped model")
    src.add_argument("--init", action="store_true", help="probe one initialised model (--task, --preset)")
    p.add_argument("--task", default=None, help="task for --init")
    p.add_argument("--preset", default="paper", help="preset for --init and the default initialised models")
    p.add_argument("--tasks", nargs="+", default=list(TASK_NAMES), help="tasks for the default set")
    p.add_argument("--n-prompts", type=int, default=64, help="prompts per model (default 64)")
    p.add_argument("--sites", nargs="+", default=None, help="hook names (default: embed, first and last layer)")
    p.add_argument("--features", nargs="+", default=None, help="features (default all)")
    p.add_argument("--probes", nargs="+", default=None, help="mlp and/or ridge (default both)")
    p.add_argument("--seeds", type=int, default=2, help="split/probe seeds (default 2)")
    p.add_argument("--quick", action="store_true", help="ridge only, 1 seed, 48 prompts")
    p.add_argument("--out-root", default=".", help="writes results/probe/ and figures/probe/ here")

    p = sub.add_parser("ablate", help="scramble or remove the positional structure; measure accuracy lost")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--run", nargs="+", help="run directories (default: the four shipped models)")
    src.add_argument("--pretrained", nargs="+", metavar="TASK", help="shipped models by task")
    p.add_argument("--with-seeds", action="store_true",
                   help="also the extra shipped seeds of those tasks (nope_interp/pretrained/seeds/): "
                        "mean, std and 95%% CI over seeds")
    p.add_argument("--layers", type=int, nargs="+", default=None,
                   help="ablate blocks.L.hook_resid_pre for these L (default: every layer after the first, "
                        "plus the last resid_post)")
    p.add_argument("--kinds", nargs="+", default=None, help="ablations (default all)")
    p.add_argument("--rank", type=int, default=4, help="rank of project_out in the table (default 4)")
    p.add_argument("--ranks", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16], help="ranks of the rank curve")
    p.add_argument("--n-random", type=int, default=3, help="random-subspace draws per rank (default 3)")
    p.add_argument("--n-eval", type=int, default=200, help="full-length test prompts scored (default 200)")
    p.add_argument("--n-mu", type=int, default=256, help="prompts to estimate the positional means (default 256)")
    p.add_argument("--out-root", default=".", help="writes results/ablate/ and figures/ablate/ here")
    return parser


def _cmd_train(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import torch

    from nope_interp.model import preset
    from nope_interp.train import TrainConfig, train

    if args.threads is not None:
        if args.threads < 1:
            raise NopeInterpError(f"--threads must be a positive integer, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.finalize:
        from nope_interp.train import finalize

        name = args.name or f"{args.task}-{args.preset}-s0"
        summary = finalize(Path(args.runs_dir) / name)
        print(f"test exact match {summary['test_acc']:.4f} at step {summary['steps']}; "
              f"summary: {Path(args.runs_dir) / name / 'summary.json'}")
        return 0
    model_cfg = preset(args.preset, **_model_overrides(args))
    train_kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                if f.name not in _TRAIN_SKIP and getattr(args, f.name, None) is not None}
    task_params = {} if args.n_digits is None else {"n_digits": args.n_digits}
    cfg = TrainConfig(task=args.task, task_params=task_params, **train_kw)
    name = args.name or f"{args.task}-{args.preset}-s{model_cfg.seed}"
    run_dir = Path(args.runs_dir) / name
    result = train(model_cfg, cfg, run_dir, resume=args.resume, device=args.device,
                   command=shlex.join(["nope-interp", *argv]), progress=not args.no_progress)
    print(f"test exact match {result.test_acc:.4f} after {result.steps} steps "
          f"({result.wall_time_s / 60:.1f} min); outputs in {run_dir}/")
    return 0


def _cmd_analyze(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import tasks as tasks_pkg
    from nope_interp import io
    from nope_interp.analysis import analyze_model
    from nope_interp.hooks import activation_hook_names
    from nope_interp.model import build_model, preset
    from nope_interp.plotting import plot_adjacency_by_layer, plot_cosine_heatmaps, save_figure
    from nope_interp.pretrained import load_pretrained, load_run

    if not 1 <= args.n_prompts <= 100_000:
        raise NopeInterpError(f"--n-prompts must be in [1, 100000], got {args.n_prompts}")
    task_params = {} if args.n_digits is None else {"n_digits": args.n_digits}
    exclude: frozenset[str] = frozenset()
    if args.init:
        if args.task is None:
            raise NopeInterpError(f"--init needs --task (one of: {', '.join(TASK_NAMES)})")
        model_cfg = preset(args.preset, **_model_overrides(args))
        model, task = build_model(model_cfg), tasks_pkg.get_task(args.task, **task_params)
        tweaks = "".join(f"-{k}{v}" for k, v in sorted(_model_overrides(args).items()))
        label = args.label or f"init-{args.preset}-{args.task}{tweaks}"
        source = {"init": model_cfg.to_dict()}
    else:
        run = load_run(args.run) if args.run else load_pretrained(args.pretrained)
        model, model_cfg = run.model, run.model_cfg
        task = run.task if args.task is None else tasks_pkg.get_task(args.task, **task_params)
        tc = run.train_cfg
        if task.name == tc.task:
            exclude = frozenset(ex.prompt for ex in task.splits(tc.n_train, tc.n_test, tc.data_seed).train)
        label = args.label or (Path(args.run).name if args.run else f"pretrained-{args.pretrained}")
        source = {"model_source": str(run.path), "model": model_cfg.to_dict()}
    activation_hook_names(model_cfg.n_layers, tuple(args.points))  # validates the points before any work
    print(f"analysing {label}: {args.n_prompts} {task.name} prompts ...", flush=True)
    result = analyze_model(model, task, args.n_prompts, seed=args.prompt_seed, points=tuple(args.points),
                           exclude=exclude, meta={**source, **io.provenance()})
    root = Path(args.out_root)
    scores = io.write_json(root / "results" / "analyze" / label / "scores.json", result.to_dict())
    fig_dir = root / "figures" / "analyze" / label
    f1 = save_figure(plot_cosine_heatmaps(result.example_sim, result.sites, result.example_prompt,
                                          f"{label}: cosine similarity of {result.example_prompt!r}"),
                     fig_dir / "cosine.html")
    f2 = save_figure(plot_adjacency_by_layer({task.name: {label: result.scores["row_mean"]}}),
                     fig_dir / "adjacency.html")
    row = result.scores["row_mean"]
    for site in result.sites:
        print(f"  {site:28s} {row[site]['mean']:.3f} ± {row[site]['std']:.3f}")
    print(f"scores: {scores}\nfigures: {f1}, {f2}")
    return 0


def _cmd_demo(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from nope_interp.demo import run_demo
    from nope_interp.train import resolve_device

    if not 1 <= args.n_prompts <= 100_000:
        raise NopeInterpError(f"--n-prompts must be in [1, 100000], got {args.n_prompts}")
    if args.eval_n < 1:
        raise NopeInterpError(f"--eval-n must be a positive integer, got {args.eval_n}")
    print(f"demo: {len(args.tasks)} task{'s' if len(args.tasks) != 1 else ''}, {args.n_prompts} prompts per model"
          + (" (retraining first)" if args.retrain else ""), flush=True)
    summary = run_demo(args.out_root, args.tasks, args.n_prompts, args.eval_n, args.retrain, args.runs_dir,
                       resolve_device(args.device), args.init_preset, log=lambda s: print(s, flush=True))
    root = Path(args.out_root)
    print(f"done in {summary['wall_time_s']:.0f}s\nsummary: {root / 'results' / 'summary.md'} "
          f"(+ summary.json)\nfigures: {root / 'figures' / 'demo'}/ (open the .html files in a browser; offline)")
    return 0


def _cmd_averaging(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from nope_interp.averaging_job import run_averaging

    if not 3 <= args.n_prompts <= 100_000 or args.eval_n < 1:
        raise NopeInterpError("--n-prompts must be in [3, 100000] and --eval-n positive")
    result = run_averaging(args.out_root, args.tasks, args.n_prompts, args.eval_n, log=lambda s: print(s, flush=True))
    root = Path(args.out_root)
    print(f"done in {result['wall_time_s']:.0f}s\nresults: {root / 'results' / 'averaging'}/averaging.{{json,csv}}"
          f"\nfigures: {root / 'figures' / 'averaging'}/")
    return 0


def _cmd_init_grid(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from nope_interp import io
    from nope_interp.init_grid import (
        WIDE_STDS,
        GridConfig,
        grid_config_dict,
        plot_entropy_vs_score,
        plot_grid,
        run_init_grid,
        summarize_grid,
    )
    from nope_interp.io import to_csv
    from nope_interp.plotting import save_figure

    overrides: dict[str, Any] = {"task_names": tuple(args.tasks)}
    if args.wide_std:
        overrides["stds"] = WIDE_STDS
    if args.seeds is not None:
        overrides["seeds"] = args.seeds
    if args.n_prompts is not None:
        overrides["n_prompts"] = args.n_prompts
    cfg = GridConfig.quick(**overrides) if args.quick else GridConfig(**overrides)
    rows = run_init_grid(cfg, log=lambda s: print(s, flush=True))
    summary = summarize_grid(rows)
    root = Path(args.out_root)
    res = root / "results" / "init_grid"
    io.write_json(res / "init_grid.json", {"config": grid_config_dict(cfg), "summary": summary, "rows": rows,
                                          **io.provenance()})
    io.atomic_write_text(res / "init_grid.csv", to_csv(rows))
    io.atomic_write_text(res / "init_grid_summary.csv", to_csv(summary))
    figs = root / "figures" / "init_grid"
    for grid in ("init", "size"):
        for site in ("z_L0", "resid_post_L0"):
            save_figure(plot_grid(summary, grid, site), figs / f"{grid}_grid_{site}.html")
    save_figure(plot_entropy_vs_score(rows), figs / "entropy_vs_score.html")
    print(f"results: {res}/init_grid.{{json,csv}}, init_grid_summary.csv\nfigures: {figs}/")
    return 0


def _cmd_probe(args: argparse.Namespace, argv: Sequence[str]) -> int:
    import tasks as tasks_pkg
    from nope_interp.model import build_model, preset
    from nope_interp.pretrained import available_pretrained, load_pretrained, load_run
    from nope_interp.probe_job import run_probes
    from nope_interp.probing import FEATURES, PROBES

    features = tuple(args.features or FEATURES)
    probes = ("ridge",) if args.quick and not args.probes else tuple(args.probes or PROBES)
    seeds = tuple(range(1 if args.quick else args.seeds))
    n_prompts = 48 if args.quick else args.n_prompts
    for f in features:
        if f not in FEATURES:
            raise NopeInterpError(f"unknown feature {f!r}; allowed: {', '.join(FEATURES)}")
    for p in probes:
        if p not in PROBES:
            raise NopeInterpError(f"unknown probe {p!r}; allowed: {', '.join(PROBES)}")
    if not seeds or not 8 <= n_prompts <= 100_000:
        raise NopeInterpError("--seeds must be >= 1 and --n-prompts in [8, 100000]")

    def trained_entry(run):
        tc = run.train_cfg
        excl = frozenset(e.prompt for e in run.task.splits(tc.n_train, tc.n_test, tc.data_seed).train)
        return run.model, run.task, excl

    models = {}
    if args.run or args.pretrained:
        run = load_run(args.run) if args.run else load_pretrained(args.pretrained)
        models[(run.task.name, Path(args.run).name if args.run else "trained")] = trained_entry(run)
    elif args.init:
        if args.task is None:
            raise NopeInterpError(f"--init needs --task (one of: {', '.join(TASK_NAMES)})")
        task = tasks_pkg.get_task(args.task)
        models[(task.name, f"initialised ({args.preset})")] = (build_model(preset(args.preset)), task, frozenset())
    else:
        init_cfg = preset(args.preset)
        for name in args.tasks:
            task = tasks_pkg.get_task(name)
            models[(name, "initialised")] = (build_model(init_cfg), task, frozenset())
            if name in available_pretrained():
                models[(name, "trained")] = trained_entry(load_pretrained(name))
    result = run_probes(args.out_root, models, n_prompts, args.sites, features, probes, seeds,
                        log=lambda s: print(s, flush=True))
    root = Path(args.out_root)
    print(f"done in {result['wall_time_s']:.0f}s\nresults: {root / 'results' / 'probe'}/probe.{{json,csv}}"
          f"\nfigures: {root / 'figures' / 'probe'}/")
    return 0


def _cmd_ablate(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from nope_interp.ablation_job import KINDS, run_ablation, write_ablations
    from nope_interp.hooks import hook_name
    from nope_interp.pretrained import available_pretrained, available_seed_runs, load_pretrained, load_run

    kinds = tuple(args.kinds or KINDS)
    for k in kinds:
        if k not in KINDS:
            raise NopeInterpError(f"unknown ablation {k!r}; allowed: {', '.join(KINDS)}")
    if args.n_eval < 1 or args.n_mu < 2 or args.n_random < 1 or args.rank < 0 or min(args.ranks) < 0:
        raise NopeInterpError("--n-eval, --n-random must be positive, --n-mu >= 2, ranks >= 0")
    if args.run:
        if args.with_seeds:
            raise NopeInterpError("--with-seeds adds the shipped seeds to --pretrained (or the default); "
                                  "with --run, list every run directory")
        runs = [load_run(r) for r in args.run]
    else:
        names = args.pretrained or available_pretrained()
        runs = []
        for n in names:
            runs.append(load_pretrained(n))
            runs += [load_run(p) for p in (available_seed_runs(n) if args.with_seeds else [])]
    print(f"ablating {len(runs)} model(s): " + ", ".join(f"{r.task.name}:{r.path.name}" for r in runs), flush=True)
    results = []
    for run in runs:
        n_layers = run.model_cfg.n_layers
        sites = None
        if args.layers is not None:
            sites = [hook_name("resid_pre", layer, n_layers=n_layers) for layer in args.layers]
        tc = run.train_cfg
        train = frozenset(e.prompt for e in run.task.splits(tc.n_train, tc.n_test, tc.data_seed).train)
        res = run_ablation(run.model, run.task, train, sites, kinds, args.rank, args.ranks,
                           n_random=args.n_random, n_eval=args.n_eval, n_mu=args.n_mu,
                           log=lambda s: print(s, flush=True))
        res["run"], res["model_seed"] = str(run.path), run.model_cfg.seed
        results.append(res)
    paths = write_ablations(args.out_root, results)
    print("outputs: " + ", ".join(str(p) for p in paths))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nope-interp`` console script. Returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        commands = {"train": _cmd_train, "analyze": _cmd_analyze, "demo": _cmd_demo, "averaging": _cmd_averaging,
                    "init-grid": _cmd_init_grid, "probe": _cmd_probe, "ablate": _cmd_ablate}
        return commands[args.command](args, argv)
    except (NopeInterpError, TaskError) as err:
        print(f"nope-interp: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
