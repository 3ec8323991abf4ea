"""Shared fixtures: tiny NoPE configs and models (packages imported inside fixtures so jaxtyping's
import hook instruments them first, as TransformerLens's tests/AGENTS.md advises)."""

import pytest
import torch


@pytest.fixture
def tiny_cfg():
    from nope_interp.model import preset

    return preset("tiny")


@pytest.fixture
def tiny_model(tiny_cfg):
    from nope_interp.model import build_model

    return build_model(tiny_cfg)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def assert_no_hooks(model) -> None:
    """No HookPoint of ``model`` has a forward or backward hook left attached."""
    from transformer_lens.hook_points import HookPoint

    for name, mod in model.named_modules():
        if isinstance(mod, HookPoint):
            assert not mod._forward_hooks, f"forward hook left on {name}"
            assert not mod._backward_hooks, f"backward hook left on {name}"
