"""Attention-pattern interventions: what they do to the adjacency score, and that no hook is left behind."""

import pytest
import torch
from conftest import assert_no_hooks


def test_identity_attention_removes_the_pattern_and_hooks_are_removed():
    import tasks
    from nope_interp.analysis import analyze_model
    from nope_interp.interventions import replaced_pattern
    from nope_interp.model import build_model, preset

    model = build_model(preset("cpu", d_model=256, d_head=64, seed=1))
    task = tasks.get_task("addition")
    clean = analyze_model(model, task, 32).scores["row_mean"]["blocks.0.attn.hook_z"]["mean"]
    with replaced_pattern(model, 0, "identity"):
        ident = analyze_model(model, task, 32).scores["row_mean"]
    assert clean > 0.9 and abs(ident["blocks.0.attn.hook_z"]["mean"] - 0.5) < 0.1
    assert_no_hooks(model)
    with replaced_pattern(model, 0, "uniform"):
        uni = analyze_model(model, task, 32).scores["row_mean"]["blocks.0.attn.hook_z"]["mean"]
    assert uni > 0.95
    assert_no_hooks(model)


def test_no_hook_left_after_an_intervention_that_raised(tiny_model):
    from nope_interp.interventions import replaced_pattern

    with pytest.raises(RuntimeError, match="boom"):
        with replaced_pattern(tiny_model, 1, "random_matched", seed=2):
            tiny_model(torch.zeros(1, 5, dtype=torch.long))
            raise RuntimeError("boom")
    assert_no_hooks(tiny_model)


def test_bad_intervention_input(tiny_model):
    from nope_interp.errors import NopeInterpError
    from nope_interp.interventions import pattern_replacement_hook, replaced_pattern

    with pytest.raises(NopeInterpError, match="allowed: uniform, identity, random_matched"):
        pattern_replacement_hook("shuffle")
    with pytest.raises(NopeInterpError, match="out of range"):
        with replaced_pattern(tiny_model, 5, "uniform"):
            pass
    assert_no_hooks(tiny_model)
    from contextlib import contextmanager

    from conftest import unhooked

    for seed in (1.5, -1, "0", 2**63):  # 1.5 failed in torch ("manual_seed expected a long")
        with pytest.raises(NopeInterpError, match="seed must be an integer"):
            with contextmanager(unhooked(replaced_pattern))(tiny_model, 0, "random_matched", seed=seed):
                pass
        assert_no_hooks(tiny_model)
