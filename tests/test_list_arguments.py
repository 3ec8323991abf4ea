"""List arguments whose order matters (points, hook names, sites, options, prompts, rows): an unordered collection
(a set, a frozenset, a dict view) is refused in one line naming the parameter, and a generator or an iterator
(``iter([...])``) is read once, giving what the list gives (:func:`nope_interp.checks.in_order`).

Before: ``check_points({"z", "resid_post"})`` and the functions behind it took a set and gave the sites in an
arbitrary order; ``fast_activations(model, tokens, (n for n in names))`` returned ``{}`` (its checks used the
generator up), ``collect_activations`` with a generator of points failed, ``check_choices`` let a repeated entry of
a generator through, ``predict`` raised a TypeError on a generator, ``to_csv`` wrote a header only.

Functions are called without pytest's jaxtyping hook (:func:`conftest.unhooked`), as users call them: the hook
would refuse a generator for a ``list | tuple`` annotation before the toolkit's own check.
"""

import types

import pytest
import torch
from conftest import unhooked

UNORDERED = {
    "set": lambda xs: set(xs),
    "frozenset": lambda xs: frozenset(xs),
}
DICT_VIEWS = {  # ordered (a dict keeps its insertion order): read as the list
    "dict keys": lambda xs: dict.fromkeys(xs).keys(),
    "dict values": lambda xs: {i: x for i, x in enumerate(xs)}.values(),
}
#: The functions whose results come in a fixed order whatever the argument's order: a set is accepted there.
ANY_ORDER = {"check_points", "activation_hook_names", "collect_activations", "iter_activations", "analyze_tokens",
             "fast_activations", "fast_activations_unsupported", "check_inputs_fit"}
ONCE = {  # read-once iterables
    "generator": lambda xs: (x for x in xs),
    "iterator": lambda xs: iter(list(xs)),
}
NAMES = ["blocks.0.hook_resid_post", "hook_embed", "blocks.0.attn.hook_z"]


def _one_line_naming(err, name):
    message = str(err.value)
    assert "\n" not in message and name in message and "unordered" in message, message
    assert "sorted(" not in message, message  # sorting is not what the user wants for hook names or examples


def _calls(model, tokens, task):
    """(the function's name, the parameter named, a call taking the list argument, a good list)."""
    from nope_interp import activations, analysis, evaluate, fast_forward, hooks, io, plotting
    from nope_interp.config import check_choices, check_tasks
    from nope_interp.jobs import common, demo, trajectory
    from nope_interp.similarity import cosine_similarity_matrix

    sim = cosine_similarity_matrix(torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(0)))
    traj = [_traj("a", "addition"), _traj("b", "reversal"), _traj("c", "addition")]
    return [
        ("check_points", "points", unhooked(hooks.check_points), ["resid_post", "z", "embed"]),
        ("activation_hook_names", "points", lambda p: unhooked(hooks.activation_hook_names)(2, p),
         ["resid_post", "z", "embed"]),
        ("collect_activations", "points", lambda p: unhooked(activations.collect_activations)(model, tokens, p),
         ["resid_post", "z", "embed"]),
        ("iter_activations", "points", lambda p: list(unhooked(activations.iter_activations)(model, tokens, p)),
         ["resid_post", "z"]),
        ("analyze_tokens", "points", lambda p: unhooked(analysis.analyze_tokens)(model, tokens, p),
         ["resid_post", "embed"]),
        ("fast_activations", "names", lambda n: unhooked(fast_forward.fast_activations)(model, tokens, n), NAMES),
        ("fast_activations_unsupported", "names",
         lambda n: unhooked(fast_forward.fast_activations_unsupported)(model, n), NAMES + ["blocks.9.x", "y"]),
        ("check_choices", "probe", lambda v: unhooked(check_choices)("probe", v, ("ridge", "mlp", "knn")),
         ["mlp", "ridge"]),
        ("check_tasks", "task", unhooked(check_tasks), ["reversal", "addition"]),
        ("shipped_entries", "task_names", lambda t: [e.label for e in unhooked(common.shipped_entries)(t)],
         ["reversal", "addition"]),
        ("check_inputs_fit", "protocols", lambda p: unhooked(common.check_inputs_fit)("analyze", [], p, None),
         ["full", "authors"]),
        ("predict", "prompts", lambda p: unhooked(evaluate.predict)(model, task, p),
         ["$12+34=", "$5+6=", "$70+8="]),
        ("to_csv", "rows", unhooked(io.to_csv), [{"a": 1}, {"b": 2, "a": 3}, {"c": 4}]),
        ("plot_cosine_heatmaps", "site_labels",
         lambda labels: unhooked(plotting.plot_cosine_heatmaps)(sim, labels, "abcde").to_json(), ["x", "y", "z"]),
        ("plot_cosine_heatmaps", "tokens",
         lambda toks: unhooked(plotting.plot_cosine_heatmaps)(sim, ["x", "y", "z"], toks).to_json(),
         ["p", "q", "r", "s", "t"]),
        ("plot_site_by_objective", "runs", lambda r: unhooked(trajectory.plot_site_by_objective)(r).to_json(), traj),
        ("sweep_models", "tasks", lambda t: unhooked(demo.sweep_models)("no-such-spec", t), ["reversal", "addition"]),
    ]


def _traj(label, task):
    from nope_interp.jobs.trajectory import RunTrajectory

    return RunTrajectory(label=label, task=task, objective="answer_only", steps=(0, 10),
                         sites=("blocks.0.attn.hook_z",), scores={"blocks.0.attn.hook_z": (0.5, 0.6)},
                         eval_steps=(10,), eval_acc=(0.2,))


@pytest.fixture(scope="module")
def calls():
    from nope_interp.model import build_model, preset
    from tasks import get_task

    torch.manual_seed(0)
    model = build_model(preset("tiny"))
    tokens = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(1))
    return _calls(model, tokens, get_task("addition", n_digits=2))


def _result(call, value):
    """What ``call(value)`` returns, or its error as ``("raised", type, message)``, comparable between two calls."""
    from nope_interp.errors import NopeInterpError

    try:
        out = call(value)
    except NopeInterpError as err:
        return ("raised", type(err), str(err))
    if isinstance(out, dict):
        return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    if hasattr(out, "acts"):  # Activations
        return out.labels, out.acts.tolist()
    if isinstance(out, list) and out and hasattr(out[0], "acts"):
        return [(a.labels, a.acts.tolist()) for a in out]
    if hasattr(out, "to_dict"):  # AnalysisResult
        return out.to_dict()
    return out


N_CALLS = 17


@pytest.mark.parametrize("index", range(N_CALLS))
@pytest.mark.parametrize("kind", list(UNORDERED))
def test_unordered_collections_are_refused_in_one_line_naming_the_parameter(calls, index, kind):
    from nope_interp.errors import NopeInterpError

    assert len(calls) == N_CALLS
    fn, name, call, good = calls[index]
    try:
        value = UNORDERED[kind](good)
    except TypeError:  # unhashable entries (dicts, trajectories): no set of them can be made
        pytest.skip(f"{fn}: its entries are unhashable, so no set of them exists")
    if fn in ANY_ORDER:  # accepted: the same as a list in some order
        assert _result(call, value) == _result(call, sorted(value, key=repr)) or fn in ("check_points",
                                                                                      "fast_activations_unsupported")
        return
    with pytest.raises(NopeInterpError) as err:
        call(value)
    _one_line_naming(err, name)
    assert fn in str(err.value) or name in ("points", "probe", "task"), str(err.value)


@pytest.mark.parametrize("index", range(N_CALLS))
@pytest.mark.parametrize("kind", list(ONCE))
def test_a_generator_or_iterator_is_read_once_and_gives_what_the_list_gives(calls, index, kind):
    fn, name, call, good = calls[index]
    want = _result(call, list(good))
    got = _result(call, ONCE[kind](good))
    assert got == want, fn
    assert _result(call, tuple(good)) == want


def test_fast_activations_of_a_generator_computes_every_name(calls):
    """The reported case: ``fast_activations(names)`` of a generator returned ``{}``."""
    fn, _, call, good = calls[5]
    assert fn == "fast_activations"
    for names in ((n for n in good), iter(good), map(str, good)):
        out = call(names)
        assert list(out) and sorted(out) == sorted(good), out.keys()


def test_a_repeated_choice_in_a_generator_is_refused():
    """Before: ``check_choices`` counted repeats on a generator it had used up, and let them through."""
    from nope_interp.config import check_choices
    from nope_interp.errors import NopeInterpError

    for values in ((v for v in ["ridge", "mlp", "ridge"]), iter(["mlp", "mlp"])):
        with pytest.raises(NopeInterpError, match="^probe names .* more than once$"):
            unhooked(check_choices)("probe", values, ("ridge", "mlp"))


def test_check_site_widths_reads_a_generator_once():
    """Before: ``any`` used up a generator of names that ``all`` then found empty, and mixed widths passed."""
    from nope_interp.activations import check_site_widths
    from nope_interp.errors import NopeInterpError

    model = types.SimpleNamespace(cfg=types.SimpleNamespace(n_heads=2, d_head=4, d_model=12))
    for names in (["hook_embed", "blocks.0.attn.hook_z"], ["blocks.0.attn.hook_z", "blocks.0.hook_resid_post"]):
        for given in (list(names), (n for n in names), iter(names)):
            with pytest.raises(NopeInterpError, match="hook_z has n_heads"):
                unhooked(check_site_widths)(model, given)
    unhooked(check_site_widths)(model, (n for n in ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]))


def test_refuse_default_only_reads_a_generator_once():
    """Before: the first field's test used the generator up, and the next default-only field went unnamed."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.jobs import long_context
    from nope_interp.jobs.common import refuse_default_only

    cfg = long_context.LongContextConfig(seeds=5, window=8, grid_preset="tiny")
    models = [types.SimpleNamespace(task=types.SimpleNamespace(name="reversal"))]
    for default_only in (long_context.DEFAULT_ONLY, iter(long_context.DEFAULT_ONLY),
                         (n for n in long_context.DEFAULT_ONLY)):
        with pytest.raises(NopeInterpError, match=r"^long-context: seeds, window, grid_preset shape the default"):
            unhooked(refuse_default_only)("long-context", cfg, default_only, "the grid", models)


@pytest.mark.parametrize("kind", list(UNORDERED))
def test_task_lists_whose_order_is_the_results_refuse_unordered_collections(kind):
    from tasks import TaskError, get_task, packed_stream

    task = get_task("addition", n_digits=2)
    prompts = ["$12+34=", "$56+78=", "$90+12="]
    examples = [task.example(p) for p in prompts]
    for name, call, good in (("prompts", lambda p: unhooked(type(task).prompt_tokens)(task, p), prompts),
                             ("examples", lambda e: unhooked(type(task).training_batch)(task, e), examples),
                             ("examples", lambda e: unhooked(packed_stream)(e, 0), examples)):
        with pytest.raises(TaskError) as err:
            call(UNORDERED[kind](good))
        _one_line_naming(err, name)
        for once in ONCE.values():  # read once, as a list
            assert torch.equal(_tensor(call(once(good))), _tensor(call(good)))
    # exclude is a set of prompts by nature: still accepted
    analysis_prompts = unhooked(type(task).analysis_prompts)
    if kind != "dict items":
        assert analysis_prompts(task, 3, 0, exclude=UNORDERED[kind](prompts[:1])) == \
            analysis_prompts(task, 3, 0, exclude=frozenset(prompts[:1]))


def _tensor(out):
    return out.tokens if hasattr(out, "tokens") else out


@pytest.mark.parametrize("index", range(N_CALLS))
@pytest.mark.parametrize("kind", list(DICT_VIEWS))
def test_a_dict_view_is_read_in_its_dicts_order(calls, index, kind):
    fn, name, call, good = calls[index]
    try:
        value = DICT_VIEWS[kind](good)
    except TypeError:  # unhashable entries (dicts, trajectories): keys impossible, values of another dict
        value = {i: g for i, g in enumerate(good)}.values()
    assert _result(call, value) == _result(call, list(good)), fn


def test_a_set_of_points_gives_the_sites_in_forward_order():
    from nope_interp.hooks import ACTIVATION_POINTS, check_points

    for points in (["z", "embed"], ["resid_post", "resid_pre", "z"], list(ACTIVATION_POINTS)):
        naive = tuple(p for p in ACTIVATION_POINTS if p in points)
        assert unhooked(check_points)(set(points)) == naive
        assert unhooked(check_points)(frozenset(points)) == naive
    assert unhooked(check_points)(["z", "embed"]) == ("z", "embed")  # a list keeps its own order


def test_a_0d_array_is_refused_in_one_line():
    import numpy as np

    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import check_points

    with pytest.raises(NopeInterpError, match="0-d array"):
        unhooked(check_points)(np.array("z"))
