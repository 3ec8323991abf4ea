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


@pytest.mark.parametrize(("changes", "why"), [({"attention": "bidirectional"}, "bidirectional attention"),
                                              ({"attention": "sliding", "window": 3}, "sliding-window attention")])
def test_causal_replacement_patterns_are_refused_where_the_layer_is_not_plain_causal(changes, why):
    """uniform and random_matched are causal patterns over every earlier key: on a bidirectional layer they
    would add the causal averaging the control exists to lack, on a sliding window let in keys outside it.
    identity applies to any attention; counterfactual_report refuses before any work."""
    import tasks
    from nope_interp.averaging_checks import counterfactual_report
    from nope_interp.config import preset
    from nope_interp.errors import NopeInterpError
    from nope_interp.interventions import pattern_kind_unsupported, replaced_pattern
    from nope_interp.model import build_model

    model = build_model(preset("tiny", **changes))
    tokens = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0))
    for kind in ("uniform", "random_matched"):
        assert why in pattern_kind_unsupported(model, 0, kind)
        with pytest.raises(NopeInterpError, match=f"pattern kind '{kind}' does not apply to layer 0: {why}"):
            with replaced_pattern(model, 0, kind):
                model(tokens)
        with pytest.raises(NopeInterpError, match=f"counterfactual_report: pattern kind '{kind}'"):
            counterfactual_report(model, tasks.get_task("addition", n_digits=1), 0, kinds=(kind,), n_prompts=3)
    assert pattern_kind_unsupported(model, 0, "identity") is None
    with replaced_pattern(model, 0, "identity"):
        model(tokens)
    causal = build_model(preset("tiny"))
    assert all(pattern_kind_unsupported(causal, 0, k) is None for k in ("uniform", "random_matched", "identity"))


@pytest.mark.parametrize("kind", ["uniform", "identity", "random_matched"])
def test_a_key_value_cache_step_is_refused_by_name_and_full_reruns_decode(tiny_model, kind):
    """Inside replaced_pattern, TransformerLens's model.generate (key/value cache on by default) failed with a raw
    "expanded size of the tensor" RuntimeError: a step's pattern has one query row. Now one line with the fix; with
    the cache off it decodes like greedy_decode."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.evaluate import greedy_decode
    from nope_interp.interventions import pattern_replacement_hook, replaced_pattern

    tokens = torch.randint(0, tiny_model.cfg.d_vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    with replaced_pattern(tiny_model, 0, kind, seed=3):
        with pytest.raises(NopeInterpError, match=r"got 1 query rows against 7 keys \(a key/value-cache decoding "
                                                  r"step\).*use_past_kv_cache=False"):
            tiny_model.generate(tokens, max_new_tokens=2, stop_at_eos=False, verbose=False)
    assert_no_hooks(tiny_model)
    if kind != "random_matched":   # deterministic replacements: the same tokens as greedy_decode
        with replaced_pattern(tiny_model, 0, kind):
            full = tiny_model.generate(tokens, max_new_tokens=2, stop_at_eos=False, verbose=False,
                                       use_past_kv_cache=False, do_sample=False)
            ref = greedy_decode(tiny_model, tokens, 2)   # the two new tokens
        assert torch.equal(full[:, 6:], ref)
    for bad in (0, "gen", 1.5):
        with pytest.raises(NopeInterpError, match=r"random_matched' needs a torch.Generator, got"):
            unhooked(pattern_replacement_hook)("random_matched", bad)


@pytest.mark.parametrize("layer", [99, 2, -1, 1.0, True, None])
@pytest.mark.parametrize("kind", ["uniform", "identity", "random_matched"])
def test_pattern_kind_unsupported_refuses_a_layer_the_model_does_not_have(tiny_model, layer, kind):
    """Before: pattern_kind_unsupported(model, 99, "uniform") answered None (supported)."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.interventions import pattern_kind_unsupported

    with pytest.raises(NopeInterpError, match=r"^pattern_kind_unsupported: layer must be an integer in \[0, 2\) "):
        unhooked(pattern_kind_unsupported)(tiny_model, layer, kind)
    with pytest.raises(NopeInterpError, match="unknown pattern kind 'flat'"):
        pattern_kind_unsupported(tiny_model, 0, "flat")
    with pytest.raises(NopeInterpError, match="TransformerLens"):
        unhooked(pattern_kind_unsupported)(object(), 0, kind)
