"""Hook names: the one place where TransformerLens hook strings are built.

Hook points analysed by the toolkit (``docs/method.md``, "Definitions"): the token embeddings
(``hook_embed``), the residual stream of every layer (``blocks.L.hook_resid_pre/mid/post``) and the
attention output before the output projection with heads concatenated (``blocks.L.attn.hook_z``,
what the authors' code analysed). ``pattern``, ``attn_out`` and ``mlp_out`` are named for hooks too.
"""

import re
from collections.abc import Iterable

from nope_interp.checks import in_order, is_int, repeated
from nope_interp.errors import NopeInterpError

#: Points collected by :func:`nope_interp.activations.collect_activations` (all have width d_model).
ACTIVATION_POINTS: tuple[str, ...] = ("embed", "resid_pre", "z", "resid_mid", "resid_post")
_LAYER_HOOKS = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "z": "blocks.{layer}.attn.hook_z",
    "v": "blocks.{layer}.attn.hook_v",
    "pattern": "blocks.{layer}.attn.hook_pattern",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
}
_GLOBAL_HOOKS = {"embed": "hook_embed", "pos_embed": "hook_pos_embed"}
#: Every point name :func:`hook_name` accepts.
POINTS: tuple[str, ...] = (*_GLOBAL_HOOKS, *_LAYER_HOOKS)


def _unknown_point(point: object, allowed: tuple[str, ...], what: str, then: str) -> NopeInterpError:
    """The error for an unknown point name; a full hook name (``blocks.0.attn.hook_z``, ``hook_embed``) given
    where a point is expected is answered with its point (``z``); ``then`` (what to do about the layer) is added
    for the per-layer points only."""
    kind = None
    if isinstance(point, str):
        for name in allowed:
            template = _GLOBAL_HOOKS.get(name) or _LAYER_HOOKS.get(name, "")
            if template and re.fullmatch(re.escape(template).replace(r"\{layer\}", r"\d+"), point):
                kind = name
    then = "" if kind in _GLOBAL_HOOKS else then
    hint = f" ({point!r} is a full hook name: give its point, {kind!r}{then})" if kind else ""
    return NopeInterpError(f"unknown {what} {point!r}; allowed: {', '.join(allowed)}{hint}")


def hook_name(point: str, layer: int | None = None, n_layers: int | None = None) -> str:
    """Full TransformerLens hook name, e.g. ``hook_name("resid_post", 0) == "blocks.0.hook_resid_post"``.

    Args:
        point: one of :data:`POINTS`.
        layer: 0-based layer for per-layer points; must be None for ``embed``/``pos_embed``.
        n_layers: if given, ``layer`` is checked against ``[0, n_layers)``.

    Raises:
        NopeInterpError: unknown point, missing or out-of-range layer; ``n_layers`` not None nor an integer >= 1.
    """
    if n_layers is not None and (not is_int(n_layers) or n_layers < 1):
        raise NopeInterpError(f"hook_name: n_layers must be an integer >= 1 or None, got {n_layers!r}"[:300])
    if not isinstance(point, str):
        raise NopeInterpError(f"hook point must be a name (a str), one of {', '.join(POINTS)}; got "
                              f"{type(point).__name__} {point!r}"[:300])
    if point in _GLOBAL_HOOKS:
        if layer is not None:
            raise NopeInterpError(f"hook point {point!r} has no layer, got layer={layer}")
        return _GLOBAL_HOOKS[point]
    if point not in _LAYER_HOOKS:
        raise _unknown_point(point, POINTS, "hook point", ", and the layer apart")
    if not is_int(layer) or layer < 0:
        raise NopeInterpError(f"hook point {point!r} needs a layer, an integer >= 0, got "
                              f"{type(layer).__name__} {layer!r}"[:300])
    if n_layers is not None and layer >= n_layers:
        raise NopeInterpError(f"layer {layer} is out of range for a model with n_layers={n_layers} (0..{n_layers - 1})")
    return _LAYER_HOOKS[point].format(layer=layer)


def _point_rank(point: object) -> tuple[int, str]:
    """Sort key of a point name: its place in :data:`ACTIVATION_POINTS` (unknown names last, by name)."""
    return (ACTIVATION_POINTS.index(point), "") if point in ACTIVATION_POINTS else (len(ACTIVATION_POINTS), str(point))


def check_points(points: object) -> tuple[str, ...]:
    """``points`` checked as a non-empty sequence of names from :data:`ACTIVATION_POINTS` and returned as a tuple;
    the one check of every ``points`` argument and ``--points`` flag.

    Raises:
        NopeInterpError: a single string rather than a sequence, an empty sequence, an
            unknown name (a full hook name such as ``blocks.0.attn.hook_z`` is answered with its point, ``z``), or a
            name given twice (each point is one set of sites: it was analysed once, the result having fewer sites
            than asked). A generator or iterator is read once; a set is read in forward order.
    """
    if isinstance(points, (str, bytes)):
        raise NopeInterpError(f"points must be a sequence of point names (e.g. ({points!r},)), got the single "
                              f"string {points!r}; allowed: {', '.join(ACTIVATION_POINTS)}")
    if not isinstance(points, Iterable):
        raise NopeInterpError(f"points must be a sequence of point names, got {type(points).__name__} "
                              f"{points!r}; allowed: {', '.join(ACTIVATION_POINTS)}"[:300])
    points = tuple(in_order("points", points, f"point names ({', '.join(ACTIVATION_POINTS)})",  # read once
                             key=_point_rank))  # a set: in forward order, as the sites come
    if not points:
        raise NopeInterpError(f"points must not be empty; allowed: {', '.join(ACTIVATION_POINTS)}")
    for p in points:
        if not isinstance(p, str) or p not in ACTIVATION_POINTS:
            raise _unknown_point(p, ACTIVATION_POINTS, "activation point", "; that point is measured at every layer")
    twice = repeated(points)
    if twice:
        raise NopeInterpError(f"points names {', '.join(map(repr, twice))} more than once; give each point once")
    return points


def activation_hook_names(n_layers: int, points: tuple[str, ...] = ACTIVATION_POINTS) -> list[str]:
    """Hook names in forward order: ``hook_embed``, then per layer resid_pre, z, resid_mid, resid_post.

    Raises:
        NopeInterpError: ``n_layers`` not an integer >= 1; ``points`` is a single string rather than a sequence
            of names, is empty, holds a point that is not in :data:`ACTIVATION_POINTS` or one point twice.
    """
    if not is_int(n_layers) or n_layers < 1:
        raise NopeInterpError(f"n_layers must be an integer >= 1, got {n_layers!r}")
    points = check_points(points)
    names = [hook_name("embed")] if "embed" in points else []
    for layer in range(n_layers):
        names += [hook_name(p, layer) for p in ACTIVATION_POINTS[1:] if p in points]
    return names


def short_label(hook: str) -> str:
    """Compact label of a full hook name for figures: ``blocks.0.attn.hook_z`` -> ``L0 z``,
    ``blocks.2.hook_resid_pre`` -> ``L2 resid_pre``, ``blocks.0.ln1.hook_normalized`` -> ``L0 ln1 normalized``,
    ``blocks.1.mlp.hook_post`` -> ``L1 mlp post``, ``hook_embed`` -> ``embed``: distinct hook names of one model
    get distinct labels. Every table and result
    file uses the full TransformerLens name; only figure axes use this label.

    Raises:
        NopeInterpError: ``hook`` not a str."""
    if not isinstance(hook, str):
        raise NopeInterpError(f"short_label: hook must be a hook name (a str), got {type(hook).__name__} "
                              f"{hook!r}"[:300])
    parts = hook.split(".")
    if parts[0] == "blocks" and len(parts) >= 3:
        # the component is kept except for attention (L0 z, as the paper names it): dropping it gave
        # blocks.0.ln1.hook_normalized and blocks.0.ln2.hook_normalized one label, drawn as one site
        middle = [p for p in parts[2:-1] if p != "attn"]
        return " ".join([f"L{parts[1]}", *middle, parts[-1].removeprefix("hook_")])
    return hook.removeprefix("hook_")
