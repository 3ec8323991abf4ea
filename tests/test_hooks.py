"""Hook names: built in one place, full TransformerLens names, one short label for figures."""

import pytest
import torch


@pytest.mark.parametrize("point,layer,name", [
    ("embed", None, "hook_embed"), ("z", 0, "blocks.0.attn.hook_z"), ("v", 2, "blocks.2.attn.hook_v"),
    ("resid_pre", 1, "blocks.1.hook_resid_pre"), ("pattern", 3, "blocks.3.attn.hook_pattern"),
])
def test_hook_name_matches_transformer_lens(tiny_model, point, layer, name):
    from nope_interp.hooks import hook_name

    assert hook_name(point, layer) == name
    if layer is None or layer < tiny_model.cfg.n_layers:
        assert name in tiny_model.hook_dict


@pytest.mark.parametrize("name,label", [
    ("blocks.0.attn.hook_z", "L0 z"), ("blocks.12.hook_resid_post", "L12 resid_post"), ("hook_embed", "embed"),
    ("blocks.0.ln1.hook_normalized", "L0 ln1 normalized"), ("blocks.1.mlp.hook_post", "L1 mlp post"),
])
def test_short_label(name, label):
    from nope_interp.hooks import short_label

    assert short_label(name) == label


def test_short_labels_of_every_hook_of_a_model_are_distinct(tiny_model):
    """Before: blocks.0.ln1.hook_normalized and blocks.0.ln2.hook_normalized (and the two hook_scale) were both
    'L0 normalized', so SiteScores.figure drew them at one x and LagProfile.figure as two lines of one name."""
    from nope_interp.hooks import short_label

    names = list(tiny_model.hook_dict)
    labels = [short_label(n) for n in names]
    assert len(set(labels)) == len(names), [lab for lab in labels if labels.count(lab) > 1]


def test_bad_points_and_layers():
    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import activation_hook_names, hook_name

    with pytest.raises(NopeInterpError, match="unknown hook point 'q'"):
        hook_name("q", 0)
    with pytest.raises(NopeInterpError, match="out of range"):
        hook_name("z", 2, n_layers=2)
    with pytest.raises(NopeInterpError, match="has no layer"):
        hook_name("embed", 0)
    assert activation_hook_names(1, ("embed", "z")) == ["hook_embed", "blocks.0.attn.hook_z"]


def test_a_point_given_twice_is_refused_by_every_points_argument(tiny_model):
    """Before: ``points=("z", "z")`` was taken as ``("z",)`` (the hook names are chosen by membership), so an
    analysis returned fewer sites than it was asked for, and said nothing."""
    from nope_interp.activations import collect_activations
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import activation_hook_names, check_points

    tokens = torch.randint(0, 96, (2, 6), generator=torch.Generator().manual_seed(0))
    for call in (lambda p: check_points(p), lambda p: activation_hook_names(2, p),
                 lambda p: collect_activations(tiny_model, tokens, p), lambda p: analyze_tokens(tiny_model, tokens, p)):
        with pytest.raises(NopeInterpError, match=r"^points names 'z', 'resid_post' more than once; give each point "
                                                  r"once$"):
            call(("resid_post", "z", "embed", "z", "resid_post"))
        with pytest.raises(NopeInterpError, match="^points names 'z' more than once"):
            call(("z", "z"))
    assert check_points(["z", "resid_post"]) == ("z", "resid_post")


@pytest.mark.parametrize("points", ["embed", "z", "resid_post"])
def test_activation_points_given_as_one_string_are_refused_by_name(points):
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import activation_hook_names

    with pytest.raises(NopeInterpError, match=f"got the single string '{points}'; allowed: embed, resid_pre") as err:
        unhooked(activation_hook_names)(2, points)
    assert "unknown activation point" not in str(err.value)  # not reported as point 'e' / 'z'
    assert activation_hook_names(2, (points,))[0].endswith(points if points != "z" else "hook_z")


def test_numpy_integer_layers_are_layers_and_a_layer_count_below_one_is_refused():
    """Before: hook_name('z', np.int64(0)) said it needed a layer >= 0, and activation_hook_names(-1) returned
    ['hook_embed']."""
    import numpy as np
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import activation_hook_names, hook_name

    assert unhooked(hook_name)("z", np.int64(1), n_layers=np.int64(2)) == "blocks.1.attn.hook_z"
    for bad in (-1, 0, 1.5, True):
        with pytest.raises(NopeInterpError, match="n_layers must be an integer >= 1"):
            unhooked(activation_hook_names)(bad)
    assert unhooked(activation_hook_names)(np.int64(1), ("embed", "z")) == ["hook_embed", "blocks.0.attn.hook_z"]


@pytest.mark.parametrize(("given", "point"), [("blocks.0.attn.hook_z", "z"), ("hook_embed", "embed"),
                                              ("blocks.11.hook_resid_post", "resid_post"),
                                              ("blocks.2.hook_resid_pre", "resid_pre")])
def test_a_full_hook_name_where_a_point_is_expected_is_answered_with_its_point(given, point):
    """Before: ``analyze --points blocks.0.attn.hook_z`` said only "unknown activation point ..." although the
    README names sites that way; now the error gives the point to write (every layer is measured)."""
    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import activation_hook_names, hook_name

    per_layer = point != "embed"  # hook_embed has no layer: no advice about layers
    with pytest.raises(NopeInterpError, match=rf"is a full hook name: give its point, '{point}'"
                                              + ("; that point is measured at every layer" if per_layer else r"\)$")):
        activation_hook_names(2, (given,))
    with pytest.raises(NopeInterpError, match=rf"give its point, '{point}'" + (", and the layer apart" if per_layer
                                                                               else r"\)$")):
        hook_name(given, 0)
    assert activation_hook_names(12, (point,))  # the point itself is accepted


@pytest.mark.parametrize("job", ["analyze", "trajectory", "length_gen", "long_context"])
def test_every_points_flag_gives_the_hook_name_hint(job):
    """Before: the job configs checked ``points`` themselves, so ``nope-interp analyze --points
    blocks.0.attn.hook_z`` never reached the hint; every ``points`` now goes through hooks.check_points."""
    import importlib

    from conftest import build_unhooked

    from nope_interp.errors import NopeInterpError

    config = importlib.import_module(f"nope_interp.jobs.{job}").CONFIG
    with pytest.raises(NopeInterpError, match=r"'blocks.0.attn.hook_z' is a full hook name: give its point, 'z'"):
        config(points=("blocks.0.attn.hook_z",))
    for bad, message in ((("resid_final",), "unknown activation point 'resid_final'"), ((), "must not be empty"),
                         ("z", "got the single string 'z'")):
        with pytest.raises(NopeInterpError, match=message):
            build_unhooked(config, points=bad)


def test_the_cli_answers_a_hook_name_in_points_with_its_point(capsys):
    from nope_interp import cli

    assert cli.main(["analyze", "--pretrained", "reversal", "--points", "blocks.0.attn.hook_z", "--out-root",
                     "/nonexistent-never-written"]) == 2
    err = capsys.readouterr().err
    assert "give its point, 'z'" in err and err.count("\n") == 1


@pytest.mark.parametrize("point", [["z"], None, 5, b"z"])
def test_a_point_that_is_not_a_string_is_refused_by_name(point):
    """Before: hook_name(["z"], 0) raised a raw TypeError (unhashable type: 'list')."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import check_points, hook_name

    with pytest.raises(NopeInterpError, match="hook point must be a name"):
        unhooked(hook_name)(point, 0)
    with pytest.raises(NopeInterpError, match="unknown activation point"):
        unhooked(check_points)((point,))


@pytest.mark.parametrize("given", ["blocks.x.attn.hook_z", "blocks.0.attn.hook_q", "zz", "blocks.0.hook_z",
                                   "hook_embedding"])
def test_other_unknown_points_get_no_hook_name_hint(given):
    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import activation_hook_names

    with pytest.raises(NopeInterpError, match="unknown activation point") as err:
        activation_hook_names(2, (given,))
    assert "full hook name" not in str(err.value)


@pytest.mark.parametrize("n_layers", [2.5, True, 0, -1, "3"])
def test_hook_name_refuses_an_n_layers_that_is_not_a_positive_integer(n_layers):
    """Before: n_layers=2.5 let layer 2 through ("blocks.2...") and True was taken as 1."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import hook_name

    with pytest.raises(NopeInterpError, match=r"^hook_name: n_layers must be an integer >= 1 or None, got "):
        unhooked(hook_name)("z", 2, n_layers=n_layers)


@pytest.mark.parametrize("bad", [3, None, b"blocks.0.attn.hook_z", ("blocks", "0")])
def test_short_label_refuses_what_is_not_a_hook_name(bad):
    """Before: short_label(3) raised AttributeError."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError
    from nope_interp.hooks import short_label

    with pytest.raises(NopeInterpError, match=r"^short_label: hook must be a hook name \(a str\)"):
        unhooked(short_label)(bad)
