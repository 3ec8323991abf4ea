import numpy as np
import pytest
import torch


@pytest.fixture
def P():
    import nope_interp.probing as probing

    return probing


def _variance_only(gen, b=120, n=16, d=64):
    """Position only in the scale: independent random directions (cosines ~ 0), variance 1/(p+1)."""
    scale = (1.0 / torch.arange(1, n + 1, dtype=torch.float64)).sqrt()
    return torch.randn(b, n, d, generator=gen, dtype=torch.float64) * scale[None, :, None]


def _adjacency_only(gen, b=120, n=16, d=64):
    """Position only in similarity: a random walk on the sphere (constant norm, zero-mean vectors)."""
    x = torch.empty(b, n, d, dtype=torch.float64)
    h = torch.randn(b, d, generator=gen, dtype=torch.float64)
    for p in range(n):
        h = h + 0.35 * torch.randn(b, d, generator=gen, dtype=torch.float64) * h.norm(dim=-1, keepdim=True) / d**0.5
        h = h - h.mean(-1, keepdim=True)
        h = h / h.norm(dim=-1, keepdim=True)
        x[:, p] = h
    return x


def _nrmse(P, acts, feature, probe="ridge", seed=0):
    X, y, g = P.position_features(acts, feature)
    return P.fit_position_probe(X, y, g, probe, seed)


def test_variance_probe_wins_when_position_is_only_in_the_variance(P):
    acts = _variance_only(torch.Generator().manual_seed(0))
    var = _nrmse(P, acts, "variance", "mlp")["probe"].nrmse
    cos = _nrmse(P, acts, "cos_last", "mlp")["probe"].nrmse
    assert var < 0.6 and cos > 0.85 and var < cos


def test_cosine_probe_wins_when_position_is_only_in_adjacency(P):
    acts = _adjacency_only(torch.Generator().manual_seed(1))
    assert torch.allclose(acts.norm(dim=-1), torch.ones(acts.shape[:2], dtype=torch.float64))
    cos = _nrmse(P, acts, "cos_last", "mlp")["probe"].nrmse
    var = _nrmse(P, acts, "variance", "mlp")["probe"].nrmse
    assert cos < 0.7 and var > 0.9 and cos < var


@pytest.mark.parametrize("feature", ["cos_last", "cos_profile", "variance", "norm", "raw"])
def test_shuffled_targets_give_chance_for_every_feature(P, feature):
    acts = _variance_only(torch.Generator().manual_seed(2)) + _adjacency_only(torch.Generator().manual_seed(3))
    res = _nrmse(P, acts, feature, "ridge")
    assert res["shuffled_baseline"].nrmse > 0.9 and res["mean_baseline"].nrmse == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_linear_probe_of_one_feature_has_no_shuffled_r_baseline(P, seed):
    """The shuffled baseline's r of ridge on one feature was always +-the probe's r (an affine map of one
    feature correlates with the targets as the feature does): now NaN. The probe's r is checked against the
    closed form |corr(feature, y)| on the test rows; several features keep a finite shuffled r."""
    acts = _variance_only(torch.Generator().manual_seed(2)) + _adjacency_only(torch.Generator().manual_seed(3))
    for feature in ("variance", "norm", "cos_last"):
        X, y, g = P.position_features(acts, feature)
        assert X.shape[1] == 1
        res = P.fit_position_probe(X, y, g, "ridge", seed)
        assert np.isnan(res["shuffled_baseline"].pearson_r)
        assert res["shuffled_baseline"].nrmse > 0.9                 # the NRMSE baseline stays
        rng = np.random.default_rng(seed)                           # the split fit_position_probe draws
        seqs = np.unique(g)
        test = np.isin(g, rng.choice(seqs, size=max(1, round(0.25 * len(seqs))), replace=False))
        closed = abs(np.corrcoef(X[test, 0], y[test])[0, 1])
        assert abs(res["probe"].pearson_r) == pytest.approx(closed, abs=1e-9)
    X, y, g = P.position_features(acts, "cos_profile")
    assert X.shape[1] > 1 and np.isfinite(P.fit_position_probe(X, y, g, "ridge", seed)["shuffled_baseline"].pearson_r)


@pytest.mark.parametrize("probe", ["ridge", "mlp"])
@pytest.mark.parametrize("factor", [1e-300, 1e200, 1e300])
def test_a_probe_reads_features_of_any_finite_size_alike(P, probe, factor):
    """Before: features times 1e300 (finite) overflowed the scaler's variance and sklearn raised "Input X contains
    NaN". The probes standardise their features, so any positive factor gives the same scores."""
    acts = _variance_only(torch.Generator().manual_seed(2)) + _adjacency_only(torch.Generator().manual_seed(3))
    X, y, g = P.position_features(acts, "cos_profile")
    base = P.fit_position_probe(X, y, g, probe, 0)
    scaled = P.fit_position_probe(X * factor, y, g, probe, 0)
    for key in base:
        assert scaled[key].nrmse == pytest.approx(base[key].nrmse, rel=1e-6, abs=1e-9)


def test_a_constant_target_is_refused(P):
    """Before: a constant y gave NaN scores without a word."""
    from nope_interp.errors import NopeInterpError

    X = np.random.default_rng(0).normal(size=(40, 3))
    g = np.repeat(np.arange(8), 5)
    for y in (np.full(40, 3.0), np.zeros(40, dtype=np.int64)):
        with pytest.raises(NopeInterpError, match="fit_position_probe: y is constant"):
            P.fit_position_probe(X, y, g, "ridge", 0)


def test_features_targets_split_by_sequence_and_no_leak(P):
    acts = torch.randn(6, 10, 8, dtype=torch.float64)
    X, y, g = P.position_features(acts, "cos_profile")
    w = P.PROFILE_WIDTH
    # rows: positions w .. 8 (not the last position 9, the reference of cos_last)
    assert X.shape == (6 * (9 - w), w) and list(y[: 9 - w]) == list(range(w, 9))
    # the window holds exactly cos(h_p, h_{p-1}) ... cos(h_p, h_{p-w})
    a = acts[0, w] / acts[0, w].norm()
    b = acts[0, w - 2] / acts[0, w - 2].norm()
    assert X[0, 1] == pytest.approx(float(a @ b))
    X2, y2, _ = P.position_features(acts, "cos_last")
    assert list(y2[: 9 - w]) == [9 - p for p in range(w, 9)] and 0 not in y2  # the reference is never a row
    a9 = acts[0, 9] / acts[0, 9].norm()
    assert X2[0, 0] == pytest.approx(float(a @ a9))
    assert set(np.unique(g)) == set(range(6))


def test_score_predictions_against_numpy(P):
    y = np.array([0.0, 1.0, 2.0, 3.0])
    pred = np.array([0.5, 1.0, 2.5, 2.0])
    sc = P.score_predictions(y, pred)
    assert sc.nrmse == pytest.approx(np.sqrt(np.mean((y - pred) ** 2)) / np.std(y))
    assert sc.pearson_r == pytest.approx(np.corrcoef(y, pred)[0, 1]) and sc.mae == pytest.approx(0.5)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.uint32, np.int64, np.float16, np.float32])
def test_score_predictions_of_integer_and_small_float_arrays_match_float64(P, dtype):
    """Before: integer arrays were subtracted in their own dtype, so uint8 0 - 50 wrapped to 206 (NRMSE 0.466
    and MAE 64 against 1.665 and 25) and int8 100 - (-100) overflowed."""
    lo, hi = (0, 50) if np.issubdtype(dtype, np.unsignedinteger) else (-100, 100)
    y = np.array([lo, 1, 2, hi, 7], dtype=dtype)
    pred = np.array([hi, 1, 2, lo, 3], dtype=dtype)
    yf, pf = y.astype(np.float64), pred.astype(np.float64)
    sc = P.score_predictions(y, pred)
    assert sc.nrmse == pytest.approx(np.sqrt(np.mean((yf - pf) ** 2)) / np.std(yf))
    assert sc.mae == pytest.approx(np.mean(np.abs(yf - pf)))
    assert sc.pearson_r == pytest.approx(np.corrcoef(yf, pf)[0, 1])


@pytest.mark.parametrize("bad", [np.array([1 + 1j, 2, 3]), np.array([True, False, True]),
                                 np.array(["1", "2", "3"])])
def test_score_predictions_refuses_complex_bool_and_text(P, bad):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="y_true must be a non-empty 1-D numpy array of real numbers"):
        P.score_predictions(bad, np.array([1.0, 2.0, 3.0]))


def test_bad_probe_input(P):
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="allowed: cos_last"):
        P.position_features(torch.zeros(2, 8, 4, dtype=torch.float64), "entropy")
    with pytest.raises(NopeInterpError, match="allowed: mlp, ridge"):
        P.make_probe("forest", 0)
    # complex or boolean features, or none: one line naming X (sklearn's ValueError printed the array before)
    y, g = np.arange(8.0), np.repeat(np.arange(4), 2)
    for X in (np.ones((8, 1), dtype=complex), np.ones((8, 0)), np.ones((8, 2), dtype=bool)):
        with pytest.raises(NopeInterpError, match=r"fit_position_probe: X must be a 2-D real numpy array \(rows x "
                                                  r"n_features >= 1\)"):
            P.fit_position_probe(X, y, g, "ridge", 0)
    assert set(P.fit_position_probe(np.arange(8)[:, None], y, g, "ridge", 0)) == {"probe", "mean_baseline",
                                                                                  "shuffled_baseline"}


def test_text_corpus_refuses_an_unhashable_split_by_name():
    """``corpus(["train"])`` failed with "unhashable type: 'list'" in the cache, before the split was checked."""
    from conftest import unhooked

    from nope_interp import text
    from nope_interp.errors import NopeInterpError

    for bad in (["train"], {"train": 1}, "tarin", None):   # as users call them, without the suite's type checker
        with pytest.raises(NopeInterpError, match=r"unknown split .*; allowed: held_out, train"):
            unhooked(text.corpus)(bad)
        with pytest.raises(NopeInterpError, match=r"unknown split .*; allowed: held_out, train"):
            unhooked(text.text_windows)(2, 10, split=bad)


@pytest.mark.parametrize(("batch", "pos", "d_model"), [(64, 22, 384), (48, 14, 64), (24, 12, 32), (40, 7, 16)])
def test_every_feature_fails_the_noise_control(P, batch, pos, d_model):
    """Pure Gaussian noise carries no position: every feature and probe scores chance (NRMSE >= 0.95).
    Before the reference position was dropped, cos_last scored 0.86-0.93 here (cos = 1 at the last position)."""
    acts = P.noise_activations(batch, pos, d_model, seed=pos)
    assert acts.shape == (batch, pos, d_model) and torch.equal(acts, P.noise_activations(batch, pos, d_model, seed=pos))
    for feature in P.FEATURES:
        X, y, g = P.position_features(acts, feature)
        for probe in P.PROBES:
            nrmse = P.fit_position_probe(X, y, g, probe, seed=0)["probe"].nrmse
            assert nrmse >= P.NOISE_MAX_NRMSE, (feature, probe, nrmse)


@pytest.mark.parametrize("feature", ["cos_last", "cos_profile", "variance", "norm", "raw", "variance+norm"])
def test_no_feature_is_constant_by_construction_at_a_position(P, feature):
    """On noise, every feature column varies across sequences at every position that is a row: a value
    fixed by construction (cos_last = 1 at the last position) would tell the probe the position."""
    for pos, d_model in ((8, 16), (22, 128)):
        acts = P.noise_activations(30, pos, d_model, seed=1)
        X, y, g = P.position_features(acts, feature)
        assert sorted(set(y.tolist())) == sorted({(pos - 1 - p) if feature == "cos_last" else p
                                                 for p in range(P.PROFILE_WIDTH, pos - 1)})
        for target in np.unique(y):
            at = X[y == target]
            assert (at.std(axis=0) > 1e-6).all(), (feature, target)


def test_probe_input_checks_positions_and_finiteness(P):
    from nope_interp.errors import NopeInterpError

    w = P.PROFILE_WIDTH
    with pytest.raises(NopeInterpError, match=f"at least {w + 3} positions"):
        P.position_features(torch.randn(4, w + 2, 8), "variance")
    assert P.position_features(torch.randn(4, w + 3, 8), "variance")[0].shape == (4 * 2, 1)
    for bad in (float("nan"), float("inf")):
        acts = torch.randn(4, 10, 8)
        acts[2, 5, 1] = bad
        with pytest.raises(NopeInterpError, match="not finite"):
            P.position_features(acts, "cos_last")
    with pytest.raises(NopeInterpError, match="batch must be an integer >= 1, got 0"):
        P.noise_activations(0, 10, 8)


def test_probe_inputs_that_would_drop_sites_or_split_nothing_are_refused(P):
    """Before: two sites with one label silently dropped the second, a string was taken as the labels list,
    test_fraction 0 or -0.5 held out one sequence, 2-D predictions were flattened, and a zero vector gave NaN
    cosine features that failed inside scikit-learn."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    acts = P.noise_activations(6, 10, 4, seed=0)
    four = torch.stack([acts, acts])
    X, y, g = P.position_features(acts, "variance")
    U = unhooked
    cases = [
        (lambda: U(P.probe_sites)(four, ["a"], ("variance",), ("ridge",), (0,)), "labels must name each of the 2"),
        (lambda: U(P.probe_sites)(four, "ab", ("variance",), ("ridge",), (0,)), "labels must be a non-empty list"),
        (lambda: U(P.probe_sites)(four, ["a", "b"], (), ("ridge",), (0,)), "features must be a non-empty list"),
        (lambda: U(P.probe_sites)(four, ["a", "b"], ("variance",), ("ridge",), ()), "seeds must be a non-empty"),
        (lambda: U(P.probe_sites)(four, ["a", "b"], ("variance",), ("ridge",), (0, 1, 0)), "seeds holds 0 more than"),
        (lambda: U(P.probe_sites)(four, ["a", "a"], ("variance",), ("ridge",), (0,)), "labels holds 'a' more than"),
        (lambda: U(P.probe_sites)(four, ["a", "b"], ("variance",) * 2, ("ridge",), (0,)), "features holds 'varia"),
        (lambda: U(P.probe_sites)(acts, ["a"]), "shape \\(site, batch, pos, d_model\\)"),
        (lambda: U(P.fit_position_probe)(X, y, g, "ridge", 0, 0), "test_fraction must be a number in \\(0, 1\\)"),
        (lambda: U(P.fit_position_probe)(X, y, g, "ridge", 0, -0.5), "test_fraction"),
        (lambda: U(P.fit_position_probe)(X, y, g, "ridge", 0, 0.99), "holds out all 6 sequences"),
        (lambda: U(P.fit_position_probe)(X, y[:-1], g, "ridge"), "one row each"),
        (lambda: U(P.fit_position_probe)(X[:, 0], y, g, "ridge"), "X must be a 2-D real numpy array"),
        (lambda: U(P.fit_position_probe)(X, y, g, "ridge", -1), "seed must be an integer in \\[0, "),
        (lambda: U(P.score_predictions)(y.reshape(-1, 1), y.reshape(-1, 1)), "y_true must be a non-empty 1-D"),
        (lambda: U(P.score_predictions)(y, y[:-1]), "one length"),
        (lambda: U(P.make_probe)("mlp", -1), "seed must be an integer"),
        (lambda: U(P.noise_activations)(2.5, 10, 4), "batch must be an integer"),
        (lambda: U(P.position_features)(acts.numpy(), "variance"), "torch tensor"),
        (lambda: U(P.position_features)(torch.cat([acts[:, :3] * 0, acts[:, 3:]], 1), "cos_last"), "near-zero"),
    ]
    for call, words in cases:
        with pytest.raises(NopeInterpError, match=words):
            call()
    # a tensor that requires grad is read, not refused by numpy
    assert P.position_features(acts.clone().requires_grad_(True), "cos_last")[0].shape[0] == X.shape[0]
    rows = P.probe_sites(four, ["a", "b"], ("variance",), ("ridge",), (0,))
    assert [r["site"] for r in rows] == ["a", "b"]


def test_probe_sites_checks_every_name_and_seed_before_fitting_anything(P, monkeypatch):
    """Before: a bad last feature, probe or seed was found only after every earlier (site, feature, probe, seed)
    had been fitted (minutes with MLP probes at several sites)."""
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    fits = []
    real = P.fit_position_probe
    monkeypatch.setattr(P, "fit_position_probe", lambda *a, **k: fits.append(a) or real(*a, **k))
    four = torch.stack([P.noise_activations(6, 10, 4, seed=0)] * 2)
    for features, probes, seeds, words in [
        (("variance", "bogus"), ("ridge",), (0,), "unknown feature 'bogus'"),
        (("variance",), ("ridge", "svm"), (0,), "unknown probe 'svm'"),
        (("variance",), ("ridge",), (0, -1), "each seed must be an integer in \\[0, 4294967295\\], got -1"),
        (("variance",), ("ridge",), (0, 2**32), "each seed must be an integer"),
        (("variance",), ("ridge",), (0, 1.5), "each seed must be an integer"),
    ]:
        with pytest.raises(NopeInterpError, match=words):
            unhooked(P.probe_sites)(four, ["a", "b"], features, probes, seeds)
        assert fits == [], words
    rows = unhooked(P.probe_sites)(four, ["a", "b"], ("variance",), ("ridge",), (np.int64(3),))
    assert len(fits) == 2 and [type(r["seed"]) for r in rows] == [int, int]


def _old_mlp(seed):
    """The MLP probe before 2026-12-03: early stopping after 8 epochs without gain, at most 150 epochs."""
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(32,) * 4, max_iter=150, early_stopping=True,
                                                        n_iter_no_change=8, tol=1e-4, random_state=seed,
                                                        learning_rate_init=2e-3))


def test_mlp_probe_fits_a_clean_position_code_from_a_few_hundred_rows(P, monkeypatch):
    """Position only in the variance, 1/(p+1), measured over 2,048 coordinates (so it is nearly exact), 64
    sequences of 9 positions: 256 rows, as 64 addition prompts give. The MLP must fit the curve (below ridge,
    which can only fit a line through it); the old probe stopped early at NRMSE 0.56-0.68 on every seed."""
    acts = _variance_only(torch.Generator().manual_seed(0), b=64, n=9, d=2048)
    X, y, g = P.position_features(acts, "variance")
    assert X.shape[0] == 256
    for seed in (0, 1, 2):
        mlp = P.fit_position_probe(X, y, g, "mlp", seed)["probe"]
        ridge = P.fit_position_probe(X, y, g, "ridge", seed)["probe"]
        assert mlp.nrmse < 0.2 and mlp.nrmse < ridge.nrmse and mlp.converged is True, (seed, mlp, ridge)
    monkeypatch.setattr(P, "make_probe", lambda kind, seed: _old_mlp(seed))
    old = [P.fit_position_probe(X, y, g, "mlp", s)["probe"].nrmse for s in (0, 1, 2)]
    assert min(old) > 0.5  # the test can fail: it tells the two probes apart


def test_probe_scores_say_whether_the_fit_converged(P, monkeypatch):
    """An MLP out of epochs is marked converged=False (scikit-learn's ConvergenceWarning is caught, not shown);
    ridge is always converged; the mean baseline is not fitted (None). Other warnings still pass through."""
    import warnings

    acts = _variance_only(torch.Generator().manual_seed(4), b=16, n=10, d=32)
    X, y, g = P.position_features(acts, "variance")
    res = P.fit_position_probe(X, y, g, "ridge", 0)
    assert (res["probe"].converged, res["shuffled_baseline"].converged, res["mean_baseline"].converged) == (
        True, True, None)
    monkeypatch.setattr(P, "MLP_MAX_ITER", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a ConvergenceWarning that escaped would fail here
        res = P.fit_position_probe(X, y, g, "mlp", 0)
    assert res["probe"].converged is False and res["shuffled_baseline"].converged is False
    monkeypatch.setattr(P, "make_probe", lambda kind, seed: _WarnsOnFit())
    with pytest.warns(RuntimeWarning, match="something else"):
        P.fit_position_probe(X, y, g, "mlp", 0)


class _WarnsOnFit:
    def fit(self, X, y):
        import warnings

        warnings.warn("something else", RuntimeWarning, stacklevel=2)
        return self

    def predict(self, X):
        return np.zeros(len(X))
