"""Position probes: cosine-similarity features against Chi et al.'s variance (``docs/method.md``).

Chi, Fan, Rudnicky and Ramadge ("Latent Positional Information is in the Self-Attention Variance of
Transformer Language Models Without Positional Embeddings", ACL 2023) read the position of a token off
the variance of its representation; the features below compare that with cosine-similarity features.

Features per position p of a sequence h (``pos x d_model``) at one hook site:

* ``cos_last``: cos(h_p, h_last), a scalar; target |p - last| (the authors' code). At p = last it is 1 by
  construction (target 0), which tells the probe where the last position is even for pure noise, so the
  reference position itself is never a row;
* ``cos_profile``: cos(h_p, h_{p-1}), ..., cos(h_p, h_{p-W}), the similarities to the W =
  :data:`PROFILE_WIDTH` previous positions; target p. (A whole masked row of the cosine matrix would
  leak p through the number of unmasked entries, so a fixed-width window is used.);
* ``variance``: the variance across the d_model coordinates of h_p (Chi et al., ACL 2023); target p;
* ``norm``: |h_p|; target p;
* ``raw``: h_p itself (an upper bound); target p;
* ``variance+norm``: both scalars.

Every feature is computed at the positions W <= p < last only, so all features share one target set and
no feature is constant by construction at a known position (``cos_profile`` would be 1 at p = 0, whose
window reaches no earlier position; ``cos_last`` is 1 at p = last). On i.i.d. Gaussian noise, which
carries no position, every feature is at chance (:func:`noise_activations` is the control).
Activations with NaN or inf entries are refused (:func:`nope_interp.similarity.check_finite`).

Probes (scikit-learn, features standardised): ``mlp``, an MLPRegressor with 4 hidden layers (the
4-layer MLP probe of ``docs/method.md``), fitted by Adam with early stopping on a 10% validation split, and
``ridge``, a linear probe. Train/test split by sequence, never by position. Until 2026-12-03 the MLP's early
stopping gave up after 8 epochs without improvement and at most 150 epochs: on a few hundred rows (64 prompts
of a 9-character task) it stopped long before it fitted (trained addition, L0 ``hook_z``: NRMSE 0.46 for
``cos_profile`` and 0.89 for ``variance``, against 0.09 and 0.09 with the patience of :data:`MLP_PATIENCE`
epochs; ``docs/measured/probe/mlp_fit.md``). Fitting to convergence without early stopping (L-BFGS) overfits
elsewhere (initialised reversal, L0 ``resid_post``: 0.91 against 0.51), so the validation split stays. Each
fitted probe says whether its optimiser stopped by itself (:attr:`ProbeScore.converged`).
Metrics on the held-out sequences: NRMSE = RMSE / standard deviation of the test targets (so predicting
the test mean scores 1.0), Pearson r, MAE (in positions); each with two chance baselines: predicting the
training mean, and the same probe trained on targets shuffled across training rows. Pearson r has no chance
value in either where it is undefined: constant predictions (the mean baseline) and a linear probe of one
feature, whose r is +-corr(feature, targets) however it was fitted (NaN there; NRMSE is the baseline).
"""

import dataclasses
import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import Ridge
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import Tensor

from nope_interp.checks import is_int, is_real
from nope_interp.errors import NopeInterpError
from nope_interp.similarity import (
    check_finite,
    check_host_memory,
    check_tensor,
    cosine_similarity_matrix,
    near_zero_positions,
)

FEATURES = ("cos_last", "cos_profile", "variance", "norm", "raw", "variance+norm")
PROBES = ("mlp", "ridge")
#: Width of the ``cos_profile`` window; features are computed for positions PROFILE_WIDTH <= p < last.
PROFILE_WIDTH = 4
#: A probe on :func:`noise_activations` whose held-out NRMSE is below this reads position from something
#: that is not in the activations (a feature leaking position by construction); chance is 1.0.
NOISE_MAX_NRMSE = 0.95
#: Epochs the MLP probe may train; early stopping usually ends it sooner.
MLP_MAX_ITER = 1000
#: Epochs without a validation R^2 gain of at least 1e-5 after which the MLP probe stops.
MLP_PATIENCE = 30


def _check_integer(fn: str, name: str, value: object, low: int, high: int | None = None) -> None:
    if not is_int(value) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise NopeInterpError(f"{fn}: {name} must be an integer {bound}, got {value!r}")


def _vector(fn: str, name: str, x: object, as_float: bool = True) -> np.ndarray:
    """``x`` checked as a non-empty 1-D real (integer or floating) array with finite values, as float64 unless
    ``as_float`` is False (group ids). Float64 before any arithmetic: integer arrays wrap around on subtraction
    (uint8 ``0 - 50`` is 206), and complex ones lose their imaginary part with only a warning."""
    if isinstance(x, Tensor) or not isinstance(x, np.ndarray) or x.ndim != 1 or len(x) == 0 \
            or not (np.issubdtype(x.dtype, np.integer) or np.issubdtype(x.dtype, np.floating)):
        raise NopeInterpError(f"{fn}: {name} must be a non-empty 1-D numpy array of real numbers (integer or "
                              f"floating), got {type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}")
    if not np.isfinite(x).all():
        raise NopeInterpError(f"{fn}: {name} has NaN or infinite entries")
    return x.astype(np.float64) if as_float else x


def position_features(
    acts: Float[Tensor, "batch pos d_model"], feature: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Feature matrix, targets and sequence ids for every (sequence, position).

    Args:
        acts: activations of one site (any float dtype, finite).
        feature: one of :data:`FEATURES`.

    Returns:
        ``X`` (float64, ``batch*(pos - PROFILE_WIDTH - 1) x n_features``: positions PROFILE_WIDTH .. pos-2 of
        each sequence), ``y`` (position targets, see the module docstring) and ``groups`` (the sequence
        index of each row, for splitting by sequence).

    Raises:
        NopeInterpError: unknown feature name; ``acts`` not a real float tensor ``(batch, pos, d_model)`` with
            data (:func:`nope_interp.similarity.check_tensor`); ``pos < PROFILE_WIDTH + 3`` (fewer than 2
            target positions); NaN or inf entries in ``acts``; a near-zero vector (its cosines are undefined)
            for the cosine features.
    """
    if feature not in FEATURES:
        raise NopeInterpError(f"unknown feature {feature!r}; allowed: {', '.join(FEATURES)}")
    check_tensor(acts, "acts", "(batch, pos, d_model)", ndim=3, min_sizes={0: 1, 2: 1}, fn="position_features")
    acts = acts.detach()
    b, n, _ = acts.shape
    w = PROFILE_WIDTH
    if n < w + 3:
        raise NopeInterpError(f"position probes need at least {w + 3} positions, got {n}")
    check_finite(acts)
    x = acts.double().cpu()  # the features go to numpy: computed on the CPU whatever the device
    if feature.startswith("cos_"):
        zero = near_zero_positions(x)
        if bool(zero.any()):
            where = tuple(int(i) for i in zero.nonzero()[0])
            raise NopeInterpError(f"position_features: {int(zero.sum())} near-zero vectors in acts (first at (batch, "
                                  f"pos) {where}) have undefined cosines; feature {feature!r} cannot be computed")
    pos = torch.arange(n, dtype=torch.float64).expand(b, n)
    if feature == "cos_last":
        sim = cosine_similarity_matrix(x)[:, :, -1]
        feats, target = sim.unsqueeze(-1), (n - 1) - pos
    elif feature == "cos_profile":
        sim = cosine_similarity_matrix(x)
        cols = torch.arange(n).unsqueeze(-1) - torch.arange(1, w + 1)  # p-1 ... p-w (negative for p < w)
        feats = torch.gather(sim, 2, cols.clamp_min(0).expand(b, n, w))
        target = pos
    elif feature == "variance":
        feats, target = x.var(-1, unbiased=False).unsqueeze(-1), pos
    elif feature == "norm":
        feats, target = torch.linalg.vector_norm(x, dim=-1).unsqueeze(-1), pos
    elif feature == "raw":
        feats, target = x, pos
    else:
        feats = torch.stack([x.var(-1, unbiased=False), torch.linalg.vector_norm(x, dim=-1)], dim=-1)
        target = pos
    groups = torch.arange(b).unsqueeze(-1).expand(b, n)
    keep = slice(w, n - 1)  # not p < w (window reaches no earlier position), not p = last (cos_last = 1)
    feats, target, groups = feats[:, keep], target[:, keep], groups[:, keep]
    return feats.reshape(-1, feats.shape[-1]).numpy(), target.reshape(-1).numpy(), groups.reshape(-1).numpy()


def noise_activations(batch: int, pos: int, d_model: int, seed: int = 0) -> Float[Tensor, "batch pos d_model"]:
    """The noise-input control: i.i.d. standard Gaussian activations (float32), which carry no position.

    A probe of any feature on them must score chance (held-out NRMSE about 1.0, at least
    :data:`NOISE_MAX_NRMSE`); a feature that does better reads position off its own construction.

    Raises:
        NopeInterpError: a size not an integer >= 1; ``seed`` not an integer >= 0; activations that would not fit
            the free memory (:func:`~nope_interp.similarity.check_host_memory`).
    """
    for name, v in (("batch", batch), ("pos", pos), ("d_model", d_model)):
        _check_integer("noise_activations", name, v, 1)
    _check_integer("noise_activations", "seed", seed, 0)
    check_host_memory(f"noise_activations(batch={int(batch)}, pos={int(pos)}, d_model={int(d_model)})",
                      {"activations (float32)": 4 * int(batch) * int(pos) * int(d_model)}, "use smaller sizes")
    return torch.randn(int(batch), int(pos), int(d_model), generator=torch.Generator().manual_seed(int(seed)))


def make_probe(kind: str, seed: int):
    """A scikit-learn pipeline: StandardScaler + MLPRegressor (4 hidden layers of 32, ReLU, Adam at lr 2e-3,
    early stopping on a 10% validation split after :data:`MLP_PATIENCE` epochs without gain, at most
    :data:`MLP_MAX_ITER` epochs, initialised and split from ``seed``) or Ridge (alpha 1).

    Raises:
        NopeInterpError: ``kind`` not in :data:`PROBES`; ``seed`` not an integer in [0, 2**32).
    """
    _check_integer("make_probe", "seed", seed, 0, 2**32 - 1)
    seed = int(seed)
    if kind == "mlp":
        reg = MLPRegressor(hidden_layer_sizes=(32, 32, 32, 32), max_iter=MLP_MAX_ITER, early_stopping=True,
                           n_iter_no_change=MLP_PATIENCE, tol=1e-5, random_state=seed, learning_rate_init=2e-3)
    elif kind == "ridge":
        reg = Ridge(alpha=1.0)
    else:
        raise NopeInterpError(f"unknown probe {kind!r}; allowed: {', '.join(PROBES)}")
    return make_pipeline(StandardScaler(), reg)


@dataclasses.dataclass(frozen=True)
class ProbeScore:
    """Held-out metrics of one probe. NRMSE: RMSE / std of test targets (0 best, 1 = predicting the mean).
    pearson_r in [-1, 1] (NaN for constant predictions, and for the shuffled baseline of ridge on one feature). mae
    in positions. converged: whether the fitted probe's optimiser stopped by itself (always true for ridge, a closed
    form; False for an MLP that used all :data:`MLP_MAX_ITER` epochs, so its score may be worse than the probe can
    do); None for scores of predictions that were not fitted (the mean baseline).
    """

    nrmse: float
    pearson_r: float
    mae: float
    converged: bool | None = None


def score_predictions(y_true: np.ndarray, y_pred: np.ndarray) -> ProbeScore:
    """NRMSE, Pearson r and MAE of predictions. NRMSE is NaN when ``y_true`` is constant (no spread to divide
    by), Pearson r when either array is.

    Raises:
        NopeInterpError: ``y_true`` and ``y_pred`` are not 1-D real (integer or floating) arrays of one length
            >= 1 with finite values. Both are scored in float64 (an integer array's differences do not wrap).
    """
    y_true, y_pred = _vector("score_predictions", "y_true", y_true), _vector("score_predictions", "y_pred", y_pred)
    if y_true.shape != y_pred.shape:
        raise NopeInterpError(f"score_predictions: y_true and y_pred must have one length, got {y_true.shape[0]} "
                              f"and {y_pred.shape[0]}")
    sd = float(np.std(y_true))
    rmse = float(np.sqrt(np.mean((y_true - y_pred) ** 2)))
    r = math.nan if np.std(y_pred) < 1e-12 or sd < 1e-12 else float(np.corrcoef(y_true, y_pred)[0, 1])
    return ProbeScore(nrmse=rmse / sd if sd > 0 else math.nan, pearson_r=r, mae=float(np.mean(np.abs(y_true - y_pred))))


def fit_position_probe(
    X: np.ndarray, y: np.ndarray, groups: np.ndarray, probe: str = "mlp", seed: int = 0, test_fraction: float = 0.25
) -> dict[str, ProbeScore]:
    """Fit ``probe`` on a split by sequence and score it with its baselines.

    Args:
        X: features (``rows x n_features``); y: targets (``rows``); groups: sequence id of each row.
        test_fraction: share of the sequences held out (rounded, at least one).

    Returns:
        ``{"probe": ..., "mean_baseline": ..., "shuffled_baseline": ...}``, scores on held-out sequences
        (:class:`ProbeScore`; ``converged`` says whether each fitted probe stopped before its iteration budget,
        None for the mean baseline). The shuffled baseline's Pearson r is NaN for ``ridge`` on one feature:
        a linear probe of one feature predicts an affine map of it, whose r with the targets is
        +-corr(feature, targets) whatever targets it was fitted to, the probe's own |r| (NRMSE and MAE are
        that case's baselines). The mean baseline's r is always NaN (constant predictions).

    Raises:
        NopeInterpError: fewer than 4 sequences; an unknown probe; ``X`` not a 2-D real (float or integer)
            array with at least one feature column, or ``y``/``groups``
            not 1-D arrays with one row each per row of ``X`` (finite values); ``y`` constant; ``seed`` not an
            integer in
            [0, 2**32); ``test_fraction`` not a number in (0, 1) or one that leaves no sequence to train on.
    """
    if (isinstance(X, Tensor) or not isinstance(X, np.ndarray) or X.ndim != 2 or X.shape[1] < 1
            or not (np.issubdtype(X.dtype, np.floating) or np.issubdtype(X.dtype, np.integer))):
        raise NopeInterpError(f"fit_position_probe: X must be a 2-D real numpy array (rows x n_features >= 1), got "
                              f"{type(X).__name__} {getattr(X, 'dtype', '')} {getattr(X, 'shape', '')}")
    if not np.isfinite(X).all():
        raise NopeInterpError("fit_position_probe: X has NaN or infinite entries")
    y = _vector("fit_position_probe", "y", y)
    if float(y.max()) == float(y.min()):
        raise NopeInterpError(f"fit_position_probe: y is constant ({float(y[0])!r} in every row): a position probe "
                              "needs at least two distinct targets, and its NRMSE would be undefined (NaN)")
    # each column divided by its largest magnitude: the probes standardise their features first, so this changes
    # nothing but keeps finite features of any size finite (1e300 overflowed the scaler's variance: NaN)
    scale = np.abs(X.astype(np.float64)).max(axis=0)
    X = X.astype(np.float64) / np.where(scale > 0, scale, 1.0)
    groups = _vector("fit_position_probe", "groups", groups, as_float=False)
    if not len(y) == len(groups) == X.shape[0]:
        raise NopeInterpError(f"fit_position_probe: X, y and groups must have one row each, got {X.shape[0]}, "
                              f"{len(y)} and {len(groups)}")
    _check_integer("fit_position_probe", "seed", seed, 0, 2**32 - 1)
    if not is_real(test_fraction) or not 0 < test_fraction < 1:
        raise NopeInterpError(f"fit_position_probe: test_fraction must be a number in (0, 1), got {test_fraction!r}")
    rng = np.random.default_rng(int(seed))
    seqs = np.unique(groups)
    if len(seqs) < 4:
        raise NopeInterpError(f"need at least 4 sequences to split by sequence, got {len(seqs)}")
    n_test = max(1, int(round(test_fraction * len(seqs))))
    if n_test >= len(seqs):
        raise NopeInterpError(f"fit_position_probe: test_fraction={test_fraction} holds out all {len(seqs)} sequences")
    test_seqs = rng.choice(seqs, size=n_test, replace=False)
    test = np.isin(groups, test_seqs)
    train = ~test
    model, converged = _fit(probe, seed, X[train], y[train])
    shuffled, shuffled_converged = _fit(probe, seed, X[train], rng.permutation(y[train]))
    shuffled_score = score_predictions(y[test], shuffled.predict(X[test]))
    if probe == "ridge" and X.shape[1] == 1:  # an affine map of one feature: r is +-corr(feature, y) whatever it fits
        shuffled_score = dataclasses.replace(shuffled_score, pearson_r=math.nan)
    return {
        "probe": dataclasses.replace(score_predictions(y[test], model.predict(X[test])), converged=converged),
        "mean_baseline": score_predictions(y[test], np.full(test.sum(), y[train].mean())),
        "shuffled_baseline": dataclasses.replace(shuffled_score, converged=shuffled_converged),
    }


def _fit(probe: str, seed: int, X: np.ndarray, y: np.ndarray):
    """:func:`make_probe` fitted on (X, y), and whether it converged (scikit-learn's ConvergenceWarning,
    caught here; any other warning passes through)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = make_probe(probe, seed).fit(X, y)
    converged = True
    for w in caught:
        if issubclass(w.category, ConvergenceWarning):
            converged = False
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return model, converged


def probe_sites(
    acts: Float[Tensor, "site batch pos d_model"], labels: Sequence[str], features: Sequence[str] = FEATURES,
    probes: Sequence[str] = PROBES, seeds: Sequence[int] = (0, 1, 2),
) -> list[dict[str, object]]:
    """Every (site, feature, probe, seed): one flat row with the probe's and baselines' metrics
    (``<probe|mean_baseline|shuffled_baseline>_<nrmse|pearson_r|mae>``) and whether each fitted probe
    converged (``probe_converged``, ``shuffled_baseline_converged``).

    Raises:
        NopeInterpError: an unknown feature or probe; too few positions or sequences; ``acts`` not a 4-D real
            float tensor; ``labels`` not a list of one name per site (a single string, or a count that
            differs from ``acts.shape[0]``, would drop or mislabel sites); ``features``, ``probes`` or
            ``seeds`` empty, a single string, or holding an entry twice (a seed twice would count as two); a seed
            not an integer in [0, 2**32). Names and seeds are checked before any probe is fitted.
    """
    check_tensor(acts, "acts", "(site, batch, pos, d_model)", ndim=4, fn="probe_sites")
    for name, value in (("labels", labels), ("features", features), ("probes", probes), ("seeds", seeds)):
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
            raise NopeInterpError(f"probe_sites: {name} must be a non-empty list, got {value!r}")
        twice = sorted({repr(x) for x in value if list(value).count(x) > 1})
        if twice:  # duplicate rows would count one seed (or site) as two in every mean and std
            raise NopeInterpError(f"probe_sites: {name} holds {', '.join(twice)} more than once")
    if len(labels) != acts.shape[0]:
        raise NopeInterpError(f"probe_sites: labels must name each of the {acts.shape[0]} sites in acts, got "
                              f"{len(labels)} labels")
    # every name and seed before any fitting: a bad last entry would otherwise fail after minutes of fits
    for feature in features:
        if feature not in FEATURES:
            raise NopeInterpError(f"probe_sites: unknown feature {feature!r}; allowed: {', '.join(FEATURES)}")
    for probe in probes:
        if probe not in PROBES:
            raise NopeInterpError(f"probe_sites: unknown probe {probe!r}; allowed: {', '.join(PROBES)}")
    for seed in seeds:
        _check_integer("probe_sites", "each seed", seed, 0, 2**32 - 1)
    seeds = [int(v) for v in seeds]  # numpy seeds as ints (recorded in the rows)
    rows: list[dict[str, object]] = []
    for s, label in enumerate(labels):
        for feature in features:
            X, y, groups = position_features(acts[s], feature)
            for probe in probes:
                for seed in seeds:
                    res = fit_position_probe(X, y, groups, probe, seed)
                    row: dict[str, object] = {"site": label, "feature": feature, "probe": probe, "seed": seed}
                    for name, sc in res.items():
                        row.update({f"{name}_nrmse": sc.nrmse, f"{name}_pearson_r": sc.pearson_r,
                                    f"{name}_mae": sc.mae})
                    row.update({"probe_converged": res["probe"].converged,
                                "shuffled_baseline_converged": res["shuffled_baseline"].converged})
                    rows.append(row)
    return rows
