"""The import graph of ``nope_interp`` and ``tasks``: no module imports one above it, and no cycles.

Every import counts, module-level or inside a function (read with the standard library's ``ast``).
A new module must be added to ``LAYERS``: that is where a newcomer reads what may use what.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Bottom to top. A module may import modules of its own layer or below, never above.
LAYERS: list[set[str]] = [
    {"tasks", "tasks.base", "tasks.vocab", "tasks.addition", "tasks.reversal", "tasks.indexing", "tasks.ordering"},
    {"nope_interp", "nope_interp.errors", "nope_interp.checks"},
    {"nope_interp.config", "nope_interp.stats", "nope_interp.hooks", "nope_interp.io", "nope_interp.ckernel"},
    {"nope_interp.model", "nope_interp.similarity", "nope_interp.averaging", "nope_interp.ablations",
     "nope_interp.probing", "nope_interp.fast_forward", "nope_interp.positional", "nope_interp.hf",
     "nope_interp.text"},
    {"nope_interp.evaluate", "nope_interp.activations", "nope_interp.plotting", "nope_interp.interventions"},
    {"nope_interp.train", "nope_interp.text_train", "nope_interp.analysis", "nope_interp.pretrained",
     "nope_interp.lens", "nope_interp.averaging_checks", "nope_interp.diagnostics"},
    {"nope_interp.jobs", "nope_interp.jobs.common", "nope_interp.sweep"},
    {"nope_interp.jobs.analyze", "nope_interp.jobs.demo", "nope_interp.jobs.averaging", "nope_interp.jobs.init_grid",
     "nope_interp.jobs.probe", "nope_interp.jobs.ablate", "nope_interp.jobs.trajectory",
     "nope_interp.jobs.compare", "nope_interp.jobs.long_context", "nope_interp.jobs.length_gen"},
    {"nope_interp.cli"},
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    files = [*ROOT.joinpath("nope_interp").rglob("*.py"), *ROOT.joinpath("tasks").rglob("*.py")]
    return {_module_name(p): p for p in files}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The project modules that ``path`` imports (``from nope_interp import io`` counts as ``nope_interp.io``)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in known:
                out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
    return out


def import_graph() -> dict[str, set[str]]:
    """``{module: project modules it imports}`` for every module of the two packages."""
    mods = _modules()
    return {m: _imports(p, set(mods)) - {m} for m, p in mods.items()}


def test_every_module_has_a_layer():
    layered = set().union(*LAYERS)
    assert set(_modules()) - layered == set(), "add new modules to LAYERS"
    assert layered - set(_modules()) == set(), "LAYERS names modules that no longer exist"


def test_no_module_imports_one_above_it():
    rank = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    upward = sorted(f"{m} (layer {rank[m]}) imports {d} (layer {rank[d]})"
                    for m, deps in import_graph().items() for d in deps if rank[d] > rank[m])
    assert upward == []


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack[stack.index(d):], d]))
            if d not in state:
                visit(d, [*stack, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def test_the_checker_sees_function_level_imports_and_cycles(tmp_path):
    """The graph is not vacuous: it finds the cli's import of the jobs' shared module, made inside a function
    (the job modules themselves are imported by name, with importlib, only for the command given)."""
    graph = import_graph()
    assert "nope_interp.jobs.common" in graph["nope_interp.cli"]
    assert "nope_interp.config" in graph["nope_interp.model"]
