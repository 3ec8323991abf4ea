"""The analysis jobs: one module per ``nope-interp`` command, all in the same shape.

``analyze``, ``demo``, ``averaging``, ``init_grid``, ``probe`` and ``ablate`` each define a frozen config
(the CLI flags), ``run(config, models) -> result``, ``write(result, out_root)`` and plot functions that
take results; :mod:`nope_interp.jobs.common` holds what they share. Import the job modules directly,
e.g. ``from nope_interp.jobs import analyze``.
"""

#: Every job's command name and one-line help, in ``nope-interp --help`` order. Each job module takes its
#: ``HELP`` from here, so the CLI can list the commands without importing them (and TransformerLens).
JOB_HELP: dict[str, str] = {
    "analyze": "adjacency scores at every hook site + figures for one model",
    "demo": "the main job: initialised vs trained models on all four tasks",
    "averaging": "test the averaging-effect explanation against attention patterns",
    "init-grid": "adjacency score over init mean x std and depth x width (no training)",
    "probe": "position probes: cosine-similarity features vs Chi et al.'s variance",
    "ablate": "scramble or remove the positional structure; measure accuracy lost",
    "trajectory": "adjacency score at every site through training (weights kept at log-spaced steps)",
    "compare": "initialised vs trained over seeds, per task and recipe, under each input protocol, with verdicts",
    "long-context": "adjacency score and lag profile against sequence length (random tokens and task text)",
    "length-gen": "accuracy and adjacency score by operand length, shorter and longer than trained",
}


def job_module_name(command: str) -> str:
    """The module of the job run by ``command`` (``init-grid`` -> ``nope_interp.jobs.init_grid``)."""
    return f"nope_interp.jobs.{command.replace('-', '_')}"

