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
def addition_task():
    """The addition task at the paper's size."""
    import tasks

    return tasks.get_task("addition")


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


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished 6-step run of a tiny addition model, trained through the CLI (runs/t)."""
    from nope_interp.cli import main

    root = tmp_path_factory.mktemp("runs")
    argv = ["train", "--task", "addition", "--n-digits", "2", "--preset", "tiny", "--model-n-ctx", "16",
            "--steps", "6", "--batch-size", "8", "--n-train", "100", "--n-test", "20", "--eval-every", "3",
            "--eval-n", "10", "--warmup-steps", "2", "--runs-dir", str(root), "--name", "t", "--no-progress"]
    assert main(argv) == 0
    return root / "t"
