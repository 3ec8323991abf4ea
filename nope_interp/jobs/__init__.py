"""The analysis jobs: one module per ``nope-interp`` command, all in the same shape.

``analyze``, ``demo``, ``averaging``, ``init_grid``, ``probe`` and ``ablate`` each define a frozen config
(the CLI flags), ``run(config, models) -> result``, ``write(result, out_root)`` and plot functions that
take results; :mod:`nope_interp.jobs.common` holds what they share. Import the job modules directly,
e.g. ``from nope_interp.jobs import analyze``.
"""
