"""Every public tensor function of similarity and diagnostics refuses a bad tensor argument the same way.

One shared check (:func:`nope_interp.similarity.check_tensor`): a dense, real floating ``torch.Tensor`` with
data, of the documented rank, with no empty dimension that must not be, and (where the values must be) finite.
Before it, a list or numpy array gave ``AttributeError``, a 1-D input ``IndexError``, a meta tensor a raw
``RuntimeError``, complex input a score of its real part, and NaN or inf input a NaN result or a score of 0.

The calls run in a subprocess, as users run them: pytest's jaxtyping hook checks every annotated function of
the package, inner ones included, and would refuse most of these inputs before the toolkit's own message.
"""

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, warnings
import numpy as np
import torch
from nope_interp import averaging as A, diagnostics as D, similarity as S

def act(*shape): return torch.randn(*shape, generator=torch.Generator().manual_seed(0))
def sim(n=5):
    return S.cosine_similarity_matrix(act(2, n, 4))
def pattern(n=5):
    return A.uniform_causal_pattern(n).float().expand(2, n, n).clone()
PRED = A.closed_form_uniform_cosine(6)
V = act(2, 5, 2, 3)

FUNCS = {  # name: (call, argument name in the message, a good input)
    "cosine_similarity_matrix": (S.cosine_similarity_matrix, "x", act(2, 6, 4)),
    "nonfinite_positions": (S.nonfinite_positions, "x", act(2, 6, 4)),
    "near_zero_positions": (S.near_zero_positions, "x", act(2, 6, 4)),
    "check_finite": (S.check_finite, "activations", act(2, 6, 4)),
    "adjacency_scores_of_activations": (S.adjacency_scores_of_activations, "x", act(2, 6, 4)),
    "adjacency_score_of_activations": (S.adjacency_score_of_activations, "x", act(2, 6, 4)),
    "lag_profile": (S.lag_profile, "x", act(2, 6, 4)),
    "adjacency_score": (S.adjacency_score, "sim", sim()),
    "adjacency_counts": (S.adjacency_counts, "sim", sim()),
    "adjacency_counts_naive": (S.adjacency_counts_naive, "sim", sim()),
    "adjacency_counts_sorted": (S.adjacency_counts_sorted, "sim", sim()),
    "cosine_spread": (S.cosine_spread, "sim", sim()),
    "degenerate_sequences": (S.degenerate_sequences, "sim", sim()),
    "summarize": (S.summarize, "scores", act(5).double()),
    "recency_gap": (S.recency_gap, "profile", act(3, 4)),
    "lag_summary": (S.lag_summary, "profiles", act(3, 4)),
    "positional_share": (D.positional_share, "acts", act(3, 5, 4)),
    "participation_ratio": (D.participation_ratio, "x", act(4, 3)),
    "attention_row_cosine": (A.attention_row_cosine, "pattern", pattern()),
    "attention_entropy": (A.attention_entropy, "pattern", pattern()),
    "relative_entropy_to_uniform": (A.relative_entropy_to_uniform, "pattern", pattern()),
    "pattern_weighted_values": (lambda x: A.pattern_weighted_values(x, V), "pattern",
                                pattern().unsqueeze(1).expand(2, 2, 5, 5).clone()),
    "random_causal_pattern": (lambda x: A.random_causal_pattern(x, torch.Generator().manual_seed(0)),
                              "target_entropy", act(2, 5).abs()),
    "per_position_variance": (A.per_position_variance, "x", act(2, 6, 4)),
    "lower_triangle_spearman": (lambda x: A.lower_triangle_spearman(x, PRED), "pred", PRED.float()),
    "vector_spearman": (lambda x: A.vector_spearman(x, act(6)), "a", act(6)),
}

def bad_types(good):
    return {"list": good.tolist(), "numpy": good.numpy(), "int64": good.long(), "bool": good > 0,
            "complex64": good.to(torch.complex64), "meta": good.to("meta"), "sparse": good.to_sparse(),
            "float8_e4m3fn": good.to(torch.float8_e4m3fn), "float8_e5m2": good.to(torch.float8_e5m2),
            "float": 1.5, "none": None}

def bad_shapes(name, good):
    out = {"0-D": torch.tensor(1.0)}
    if good.ndim >= 2 and name not in ("recency_gap", "random_causal_pattern"):   # these take (n,) too
        out["1-D"] = torch.ones(good.shape[-1])
    if name in ("cosine_similarity_matrix", "nonfinite_positions", "near_zero_positions", "check_finite",
                "adjacency_scores_of_activations", "adjacency_score_of_activations", "lag_profile",
                "positional_share", "participation_ratio", "per_position_variance"):
        out["d=0"] = torch.ones(*good.shape[:-1], 0)
    return out

def bad_values(name, good):
    out = {}
    for label, v in (("nan", float("nan")), ("inf", float("inf")), ("-inf", -float("inf"))):
        x = good.clone()
        if name in ("adjacency_score", "adjacency_counts", "adjacency_counts_naive", "adjacency_counts_sorted",
                    "cosine_spread", "degenerate_sequences"):
            if label == "nan" and name in ("cosine_spread", "degenerate_sequences"):
                continue  # NaN cosines (near-zero vectors) are ignored there by design
            x[1, 3, 1] = v   # below the diagonal
        elif name in ("cosine_similarity_matrix", "nonfinite_positions", "near_zero_positions"):
            continue  # these report non-finite vectors (NaN rows, a mask): documented, not an error
        else:
            x.view(-1)[2] = v
        out[label] = x
    return out

rows = []
def run(name, case, fn, x):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn(x)
            rows.append([name, case, "ok", "", len(caught)])
        except Exception as e:
            rows.append([name, case, type(e).__name__, str(e), len(caught)])

for name, (fn, arg, good) in FUNCS.items():
    run(name, "good", fn, good)
    for group in (bad_types(good), bad_shapes(name, good), bad_values(name, good)):
        for case, x in group.items():
            run(name, case, fn, x)
print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def outcomes():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, check=True)
    return {(name, case): (kind, msg, n_warn) for name, case, kind, msg, n_warn in json.loads(out.stdout)}


ARGS = {"cosine_similarity_matrix": "x", "nonfinite_positions": "x", "near_zero_positions": "x",
        "check_finite": "activations", "adjacency_scores_of_activations": "x", "adjacency_score_of_activations": "x",
        "lag_profile": "x", "adjacency_score": "sim", "adjacency_counts": "sim", "adjacency_counts_naive": "sim",
        "adjacency_counts_sorted": "sim", "cosine_spread": "sim", "degenerate_sequences": "sim",
        "summarize": "scores", "recency_gap": "profile", "lag_summary": "profiles", "positional_share": "acts",
        "participation_ratio": "x", "attention_row_cosine": "pattern", "attention_entropy": "pattern",
        "relative_entropy_to_uniform": "pattern", "pattern_weighted_values": "pattern",
        "random_causal_pattern": "target_entropy", "per_position_variance": "x", "lower_triangle_spearman": "pred",
        "vector_spearman": "a"}
#: The public name a message gives for a function that hands its argument to another.
NAMED = {"adjacency_score_of_activations": "adjacency_scores_of_activations"}


@pytest.mark.parametrize("name", sorted(ARGS))
def test_good_input_is_accepted(outcomes, name):
    assert outcomes[(name, "good")][0] == "ok", outcomes[(name, "good")]


@pytest.mark.parametrize("case", ["list", "numpy", "int64", "bool", "complex64", "meta", "sparse", "float", "none",
                                  "float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("name", sorted(ARGS))
def test_a_tensor_argument_of_the_wrong_type_is_one_line_naming_function_and_argument(outcomes, name, case):
    kind, msg, n_warn = outcomes[(name, case)]
    assert kind == "NopeInterpError", (kind, msg)
    fn = NAMED.get(name, name)
    assert msg.startswith(f"{fn}: {ARGS[name]} must be a real floating torch tensor of shape "), msg
    assert " got a " in msg and "\n" not in msg
    if case == "complex64":
        assert "torch.complex64" in msg and n_warn == 0   # not scored on its real part with torch's warning
    if case == "meta":
        assert "meta device" in msg
    if case.startswith("float8"):  # before: a raw NotImplementedError ("isfinite") in some, accepted by others
        assert f"torch.{case}" in msg and "float16 or a wider float" in msg


@pytest.mark.parametrize("name", sorted(ARGS))
def test_a_tensor_of_the_wrong_rank_or_an_empty_vector_axis_is_refused_with_its_shape(outcomes, name):
    cases = [c for c in ("0-D", "1-D", "d=0") if (name, c) in outcomes]
    assert "0-D" in cases
    for case in cases:
        kind, msg, _ = outcomes[(name, case)]
        assert kind == "NopeInterpError", (case, kind, msg)
        assert "shape" in msg and "\n" not in msg, (case, msg)


@pytest.mark.parametrize("name", sorted(ARGS))
def test_non_finite_values_are_refused_not_scored(outcomes, name):
    """Except where non-finite vectors are reported by design (NaN rows of a cosine matrix, a mask), NaN
    cosines that cosine_spread ignores, and NaN scores that summarize reads as undefined (degenerate
    sequences, left out)."""
    cases = [c for c in ("nan", "inf", "-inf") if (name, c) in outcomes]
    if name in ("cosine_similarity_matrix", "nonfinite_positions", "near_zero_positions"):
        assert not cases
        return
    if name == "summarize":  # a NaN score is accepted: undefined, counted in n_degenerate
        assert outcomes[(name, "nan")][0] == "ok", outcomes[(name, "nan")]
        cases.remove("nan")
    assert "inf" in cases and "-inf" in cases
    for case in cases:
        kind, msg, _ = outcomes[(name, case)]
        assert kind == "NopeInterpError", (case, kind, msg)
        assert any(w in msg for w in ("finite", "NaN", "inf")), (case, msg)


def test_the_shared_checker_directly():
    import torch

    from nope_interp.errors import NopeInterpError
    from nope_interp.similarity import check_tensor

    check_tensor(torch.ones(2, 3), "x", "(a, b)", ndim=2, min_sizes={-1: 3}, finite=True, fn="f")
    for bad, words in ((torch.ones(2, 3), "with at least 4 along dimension -1, got shape \\(2, 3\\)"),
                       (torch.ones(3), "got 1 dimension\\(s\\): shape \\(3,\\)"),
                       (torch.tensor([[1.0, float("nan"), 2.0]] * 4), "x must be finite, got 4 NaN or inf entries")):
        with pytest.raises(NopeInterpError, match=f"^f: .*{words}"):
            check_tensor(bad, "x", "(a, b)", ndim=2, min_sizes={-1: 4} if bad.ndim == 2 and bad.shape[0] == 2 else {},
                         finite=True, fn="f")
