"""Degenerate inputs (every vector of a sequence parallel: one token repeated) are flagged, not scored silently:
the spread against a naive loop, the flag on exact and rounding-level parallel vectors but never on small real
differences, one warning per analysis naming every site, the counts in the result, and no warning on real inputs."""

import json
import math
import warnings

import pytest
import torch
from conftest import unhooked

from nope_interp.errors import DegenerateInputWarning


def _naive_spread(sim):
    out = []
    for m in sim.reshape(-1, *sim.shape[-2:]):
        vals = [float(m[i, j]) for i in range(m.shape[0]) for j in range(i)]
        out.append(max(vals) - min(vals))
    return torch.tensor(out, dtype=torch.float64).reshape(sim.shape[:-2])


@pytest.mark.parametrize(("batch", "n"), [((), 2), ((3,), 5), ((2, 2), 9), ((1,), 33)])
def test_cosine_spread_matches_a_naive_loop(batch, n):
    from nope_interp.similarity import cosine_similarity_matrix, cosine_spread

    gen = torch.Generator().manual_seed(n)
    sim = cosine_similarity_matrix(torch.randn(*batch, n, 6, generator=gen))
    torch.testing.assert_close(cosine_spread(sim), _naive_spread(sim))


def test_cosine_spread_ignores_the_upper_triangle_and_diagonal():
    from nope_interp.similarity import cosine_spread

    sim = torch.full((4, 4), 0.3, dtype=torch.float64)
    sim.diagonal().fill_(1.0)
    sim[0, 3] = -0.9  # upper triangle: not read
    assert float(cosine_spread(sim)) == 0.0
    sim[3, 0] = -0.9
    assert float(cosine_spread(sim)) == pytest.approx(1.2)


@pytest.mark.parametrize("shape", [(1, 3), (3, 4)])
def test_cosine_spread_refuses_non_square_input(shape):
    from nope_interp.errors import NopeInterpError
    from nope_interp.similarity import cosine_spread

    with pytest.raises(NopeInterpError, match="square"):
        unhooked(cosine_spread)(torch.zeros(shape))


def test_parallel_vectors_are_degenerate_and_small_real_differences_are_not():
    from nope_interp.similarity import cosine_similarity_matrix, degenerate_sequences

    gen = torch.Generator().manual_seed(0)
    v = torch.randn(16, generator=gen)
    scales = torch.rand(12, 1, generator=gen) + 0.5
    exact = scales * v  # positive multiples: cosines exactly 1 up to rounding
    rounding = exact + 1e-7 * torch.randn(12, 16, generator=gen)  # float32 rounding level
    small = exact + 1e-3 * torch.randn(12, 16, generator=gen)  # a real, if small, difference
    sims = cosine_similarity_matrix(torch.stack([exact, rounding, small, torch.randn(12, 16, generator=gen)]))
    assert degenerate_sequences(sims).tolist() == [True, True, False, False]


def test_scoring_parallel_vectors_warns_once_with_the_count():
    from nope_interp.errors import DegenerateInputWarning
    from nope_interp.similarity import adjacency_score, adjacency_score_of_activations, cosine_similarity_matrix

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 10, 8, generator=gen)
    x[1] = x[1, :1].expand(10, 8)
    x[3] = 2.0 * x[3, :1].expand(10, 8)
    for score in (lambda: adjacency_score_of_activations(x, what="my activations"),
                  lambda: adjacency_score(cosine_similarity_matrix(x))):
        with pytest.warns(DegenerateInputWarning) as record:
            score()
        assert len(record) == 1
        w = record[0].message
        assert (w.n_degenerate, w.n_sequences) == (2, 5)
        assert "2 of 5 sequences" in str(w)
    with pytest.warns(DegenerateInputWarning, match="my activations"):
        adjacency_score_of_activations(x, max_elements=10, what="my activations")  # chunked: one warning


def test_real_inputs_never_warn():
    from nope_interp.similarity import adjacency_score_of_activations

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        adjacency_score_of_activations(torch.randn(4, 12, 8, generator=torch.Generator().manual_seed(2)))


def test_analyze_tokens_warns_once_naming_every_site_and_records_counts(tiny_model):
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import DegenerateInputWarning

    n = 12
    toks = torch.stack([torch.full((n,), 5), torch.arange(10, 10 + n), torch.full((n,), 7),
                        torch.arange(30, 30 + n)])
    for forward in ("hooked", "fast"):
        with pytest.warns(DegenerateInputWarning) as record:
            result = analyze_tokens(tiny_model, toks, forward=forward, max_bytes=1)  # one sequence per chunk
        assert len(record) == 1
        assert result.meta["degenerate_sequences"] == {site: 2 for site in result.sites}
        for site in result.sites:
            assert f"{site} (2/4)" in str(record[0].message)
    # the degenerate sequences score NaN and the summaries are over the two real ones (before: rounding noise
    # averaged in), equal to analysing those alone
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alone = analyze_tokens(tiny_model, toks[1::2])
    for r in result.scores:
        for i, site in enumerate(result.sites):
            assert torch.isnan(result.per_sequence[r][i, ::2]).all()
            got, want = result.scores[r][site], alone.scores[r][site]
            assert (got["n"], got["n_degenerate"], "n_degenerate" in want) == (2, 2, False)
            assert got["mean"] == pytest.approx(want["mean"], abs=1e-12)
            assert got["std"] == pytest.approx(want["std"], abs=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean = analyze_tokens(tiny_model, toks[1::2], meta={"label": "x"})
    assert clean.meta == {"label": "x"}


def test_lens_adjacency_scores_warns_once(tiny_model):
    from nope_interp.errors import DegenerateInputWarning
    from nope_interp.lens import adjacency_scores

    _, cache = tiny_model.run_with_cache(torch.stack([torch.full((8,), 3), torch.arange(8) + 3]))
    with pytest.warns(DegenerateInputWarning) as record:
        scores = adjacency_scores(cache)
    assert len(record) == 1
    assert all(f"{s} (1/2)" in str(record[0].message) for s in scores.sites)


def test_degenerate_report_passes_other_warnings_through():
    from nope_interp.similarity import degenerate_report

    with pytest.warns(RuntimeWarning, match="unrelated"):
        with degenerate_report() as found:
            warnings.warn("unrelated", RuntimeWarning, stacklevel=1)
    assert found == {}


def test_cli_analyze_of_a_repeated_character_warns_in_one_line_and_marks_every_site(tiny_run, tmp_path, capsys):
    from nope_interp.cli import main

    text = tmp_path / "a.txt"
    text.write_text("a" * 40 + "\n" + "To be, or not to be, that is the question.")
    assert main(["analyze", "--run", str(tiny_run), "--text-file", str(text), "--text-length", "8",
                 "--out-root", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    warning_lines = [line for line in captured.err.splitlines() if "degenerate" in line or "parallel" in line]
    assert len(warning_lines) == 1 and warning_lines[0].startswith("nope-interp: warning: text-file inputs")
    site_lines = [line for line in captured.out.splitlines() if "recency gap" in line]
    assert len(site_lines) == 9 and all("(5/10 degenerate inputs" in line for line in site_lines)  # tiny: 9 sites


@pytest.mark.parametrize("block_elements", [1, 7, 2**22])
def test_cosine_spread_in_blocks_equals_the_naive_loop_and_never_touches_the_input(block_elements):
    from nope_interp.similarity import cosine_similarity_matrix, cosine_spread

    sim = cosine_similarity_matrix(torch.randn(3, 11, 5, generator=torch.Generator().manual_seed(9)))
    before = sim.clone()
    torch.testing.assert_close(cosine_spread(sim, block_elements=block_elements), _naive_spread(sim))
    assert torch.equal(sim, before)


def test_cosine_spread_ignores_nan_and_all_nan_is_not_degenerate():
    from nope_interp.errors import NopeInterpError
    from nope_interp.similarity import cosine_spread, degenerate_sequences

    sim = torch.full((2, 4, 4), float("nan"), dtype=torch.float64)
    sim[0, 2, 0], sim[0, 3, 1] = 0.2, 0.5
    out = cosine_spread(sim)
    assert out[0].item() == pytest.approx(0.3) and torch.isnan(out[1])
    assert degenerate_sequences(sim).tolist() == [False, False]
    for bad in ("x", -1.0, True, float("nan")):
        with pytest.raises(NopeInterpError, match="tol"):
            unhooked(degenerate_sequences)(sim, bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_repeated_tokens_are_flagged_in_every_dtype_and_real_prompts_never(tiny_cfg, dtype):
    """The tolerance follows the activations' dtype: one token repeated through a float16 / bfloat16 model
    (spreads 1e-7 to 1e-5) is flagged, task prompts are not, nor a real but tiny signal in float32."""
    import tasks
    from nope_interp.analysis import analyze_tokens
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(init_std=0.4, seed=1)).to(dtype)
    task = tasks.get_task("addition")
    prompts = task.prompt_tokens(task.analysis_prompts(8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analyze_tokens(model, prompts, forward="hooked")
    with pytest.warns(Warning) as record:
        result = analyze_tokens(model, torch.full((3, 9), 17), forward="hooked")
    assert result.meta["degenerate_sequences"] == {site: 3 for site in result.sites}
    assert len(record) == 1


def test_a_tiny_real_signal_is_not_degenerate(tiny_cfg):
    """Embeddings of mean 8 and std 2e-4 (an init-grid corner): nearly parallel, but the differences are
    far above float32 rounding (spread 3.9e-10 measured), so no warning."""
    import tasks
    from nope_interp.analysis import analyze_tokens
    from nope_interp.model import build_model

    model = build_model(tiny_cfg.replace(init_mean=8.0, init_std=0.0002))
    task = tasks.get_task("addition")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        analyze_tokens(model, task.prompt_tokens(task.analysis_prompts(16)), points=("embed",), forward="hooked")


def test_a_users_float32_cosine_matrix_of_parallel_vectors_is_flagged():
    import torch.nn.functional as F

    from nope_interp.errors import DegenerateInputWarning
    from nope_interp.similarity import adjacency_score

    v = torch.randn(16, generator=torch.Generator().manual_seed(3))
    x = (torch.rand(20, 1, generator=torch.Generator().manual_seed(4)) + 0.5) * v
    sim = F.cosine_similarity(x[:, None], x[None, :], dim=-1)  # float32 cosines, rounded near 1
    with pytest.warns(DegenerateInputWarning, match="1 of 1"):
        adjacency_score(sim)


def test_nested_reports_pass_every_site_out_and_other_warnings_are_untouched(tiny_model):
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import DegenerateInputWarning
    from nope_interp.similarity import degenerate_report

    toks = torch.stack([torch.full((10,), 4), torch.arange(10) + 20])
    with pytest.warns(DegenerateInputWarning) as record:
        with degenerate_report("my study") as found:
            result = analyze_tokens(tiny_model, toks)
            analyze_tokens(tiny_model, toks)
    assert len(record) == 1 and str(record[0].message).startswith("my study")
    assert found == {f"activations at {site}": 2 for site in result.sites}

    def noisy_nan(x, hook):
        warnings.warn("from a hook", RuntimeWarning, stacklevel=1)
        return x * float("nan")

    from nope_interp.errors import NopeInterpError

    with pytest.warns(RuntimeWarning, match="from a hook"):  # still shown when the analysis then fails
        with tiny_model.hooks(fwd_hooks=[("blocks.1.hook_resid_mid", noisy_nan)]):
            with pytest.raises(NopeInterpError, match="non-finite|NaN"):
                analyze_tokens(tiny_model, toks)


def test_empty_batches_are_refused_by_name():
    from nope_interp.errors import NopeInterpError
    from nope_interp.similarity import adjacency_score, adjacency_score_of_activations

    with pytest.raises(NopeInterpError, match="batch of 0"):
        adjacency_score_of_activations(torch.zeros(0, 5, 4))
    with pytest.raises(NopeInterpError, match="no matrix"):
        adjacency_score(torch.zeros(0, 5, 5))


def test_text_prefix_never_ends_the_last_window_on_a_cut_token(tmp_path, monkeypatch):
    """Tokens longer than the reading margin: the last window used ends before the token the prefix cut."""
    from nope_interp.analysis import text_windows_of
    from nope_interp.jobs import analyze as job

    words = " ".join(["w" * 29] * 400)
    path = tmp_path / "words.txt"
    path.write_text(words)
    tok = lambda s: [len(w) for w in s.split(" ")]  # noqa: E731 - one id per word: its length
    monkeypatch.setattr(job, "TEXT_MIN_CHARS", 1)
    for n in (1, 3, 10, 26):
        windows, chars = job._text_file_windows(str(path), 5, n, tok)
        assert torch.equal(windows, text_windows_of(words, 5, n, tok))
        assert chars is not None


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_a_repeated_token_is_degenerate_at_every_model_precision_and_after_casts(tiny_model, dtype):
    """Found by a review: a float64 model's parallel vectors spread by the float64 cosines' own rounding
    (1e-16), above the float64 tolerance (4e-28); a 16-bit model's activations cast to float32 (the hooked
    analysis, ablate) were judged at float32's tolerance; positional_decomposition scored its float64 copy of
    float32 activations at float64's. Each gave rounding-noise scores (0.006, 0.101, 0.37) for no position."""
    from nope_interp.analysis import analyze_tokens
    from nope_interp.lens import adjacency_scores
    from nope_interp.similarity import adjacency_scores_of_activations, degenerate_tolerance

    assert degenerate_tolerance(torch.float64) >= 128 * torch.finfo(torch.float64).eps
    assert degenerate_tolerance(torch.float32) == pytest.approx((128 * torch.finfo(torch.float32).eps) ** 2 / 2)
    model = tiny_model.to(dtype)
    toks = torch.full((3, 12), 7)
    _, cache = model.run_with_cache(toks)
    with pytest.warns(DegenerateInputWarning):
        scores = adjacency_scores(cache)
    for site in scores.sites:
        assert torch.isnan(scores.per_sequence[site]).all(), (dtype, site)
    for forward in ("hooked", "auto"):
        with pytest.warns(DegenerateInputWarning):
            res = analyze_tokens(model, toks, forward=forward)
        assert all(res.scores["row_mean"][s]["n"] == 0 for s in res.sites), (dtype, forward)
    z = cache["blocks.0.attn.hook_z"].flatten(-2)
    with pytest.warns(DegenerateInputWarning):  # cast after the computation: the source's rounding decides
        assert torch.isnan(adjacency_scores_of_activations(z.float(), ("row_mean",),
                                                           source_dtype=dtype)["row_mean"]).all()


def test_positional_decomposition_leaves_degenerate_prompts_out_of_its_scores(tiny_model):
    """Half the prompts one repeated token: the full and content scores are those of the other half's
    sequences (before: the float64 copy's rounding noise, about 0.4, was averaged in)."""
    from nope_interp.ablations import positional_decomposition
    from nope_interp.similarity import adjacency_score_of_activations

    gen = torch.Generator().manual_seed(0)
    toks = torch.cat([torch.full((4, 16), 9), torch.randint(0, 90, (4, 16), generator=gen)])
    _, cache = tiny_model.run_with_cache(toks)
    h = cache["blocks.1.hook_resid_pre"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = positional_decomposition(h)
        real = adjacency_score_of_activations(h[4:].double())
    assert got["adjacency_full"] == pytest.approx(float(real.mean()), abs=1e-12)


def test_the_averaging_checks_scores_and_correlation_read_one_set_of_sequences(tiny_model):
    """Before: with every observed matrix degenerate, spearman and adjacency_observed were NaN but
    adjacency_predicted was 1.0 (the uniform attention's predicted matrices are not degenerate)."""
    from nope_interp.lens import averaging_check

    _, cache = tiny_model.run_with_cache(torch.full((3, 12), 5))
    with pytest.warns(DegenerateInputWarning):
        check = averaging_check(cache, 0)
    assert math.isnan(check.spearman_pred_obs) and math.isnan(check.adjacency_observed)
    assert math.isnan(check.adjacency_predicted)


def test_undefined_scores_read_back_get_no_verdict_and_no_spread():
    """A trajectory file with null scores (every prompt degenerate) was written but refused on reading;
    a NaN mean got the verdict DISAGREES; mean_std_ci of one NaN value gave std 0.0."""
    from nope_interp.jobs.demo import UNDEFINED_VERDICT, claim_verdict
    from nope_interp.jobs.trajectory import RunTrajectory
    from nope_interp.stats import mean_std_ci

    t = RunTrajectory(label="r", task="addition", objective="packed", steps=(0, 10), sites=("hook_embed",),
                      scores={"hook_embed": (float("nan"), 0.7)}, eval_steps=(10,), eval_acc=(0.5,))
    data = json.loads(json.dumps(io_json_safe(t.to_dict())))
    back = RunTrajectory.from_dict(data)
    assert math.isnan(back.scores["hook_embed"][0]) and back.scores["hook_embed"][1] == 0.7
    bad = {**data, "eval_acc": [None]}  # an accuracy is never undefined: still refused
    with pytest.raises(Exception, match="eval_acc must be a list of numbers in \\[0, 1\\]$"):
        RunTrajectory.from_dict(bad)
    assert claim_verdict(float("nan"), 0.8, 1.0) == claim_verdict(None, 0.8, 1.0) == UNDEFINED_VERDICT
    assert (claim_verdict(0.85, 0.8, 1.0), claim_verdict(0.7, 0.8, 1.0)) == ("agrees", "DISAGREES")
    assert math.isnan(mean_std_ci([float("nan")]).std) and mean_std_ci([0.5]).std == 0.0


def io_json_safe(obj):
    from nope_interp.io import json_safe

    return json_safe(obj)


def test_the_trajectory_figures_range_ignores_an_undefined_score():
    """Found by a review: a NaN first score made min() NaN and the axis [0.4, 1.02], hiding 0.2 and 0.3."""
    from nope_interp.jobs.trajectory import RunTrajectory, plot_site_by_objective

    site = "blocks.0.attn.hook_z"
    run = RunTrajectory(label="r", task="addition", objective="packed", steps=(0, 10, 20), sites=(site,),
                        scores={site: (float("nan"), 0.2, 0.3)}, eval_steps=(10,), eval_acc=(0.5,))
    low, high = plot_site_by_objective([run], site).layout.yaxis.range
    assert low <= 0.15 + 1e-12 and high == 1.02


@pytest.mark.parametrize("first_real, max_bytes", [(1, 2**27), (2, 2**27), (3, 2**27), (1, 1)])
def test_the_example_heatmap_is_the_first_input_with_an_order(tiny_model, first_real, max_bytes):
    """Before: the heatmap drew sequence 0 even when it was a repeated token (every cosine 1: no order to see).
    Given every sequence's text, analyze_tokens draws the first sequence degenerate at no site of the first
    chunk, records its index and text, and its matrices equal a cosine loop over that sequence's cached
    activations; with one sequence per chunk (max_bytes=1) the same sequence, found in a later chunk."""
    from nope_interp.analysis import analyze_tokens

    n = 10
    toks = torch.stack([torch.full((n,), 5 + i) for i in range(first_real)]
                       + [torch.arange(20, 20 + n), torch.arange(40, 40 + n)])
    texts = [f"text {i}" for i in range(len(toks))]
    with pytest.warns(DegenerateInputWarning):
        res = analyze_tokens(tiny_model, toks, example_prompt=texts, forward="hooked", max_bytes=max_bytes)
    want = first_real
    assert (res.example_index, res.example_prompt) == (want, texts[want])
    assert res.to_dict().get("example_index", 0) == want
    _, cache = tiny_model.run_with_cache(toks[want : want + 1])
    for s, site in enumerate(res.sites):
        act = cache[site][0].reshape(n, -1).double()
        naive = torch.tensor([[float(act[i] @ act[j] / (act[i].norm() * act[j].norm())) for j in range(n)]
                              for i in range(n)], dtype=torch.float64)
        torch.testing.assert_close(res.example_sim[s].double(), naive, atol=1e-5, rtol=0)


def test_one_example_text_keeps_sequence_zero_and_all_degenerate_falls_back_to_it(tiny_model):
    from nope_interp.analysis import analyze_tokens

    toks = torch.stack([torch.full((8,), 5), torch.arange(20, 28)])
    with pytest.warns(DegenerateInputWarning):
        res = analyze_tokens(tiny_model, toks, example_prompt="first")
    assert (res.example_index, res.example_prompt, "example_index" in res.to_dict()) == (0, "first", False)
    with pytest.warns(DegenerateInputWarning):
        res = analyze_tokens(tiny_model, toks[:1].repeat(3, 1), example_prompt=["a", "b", "c"])
    assert (res.example_index, res.example_prompt) == (0, "a")


@pytest.mark.parametrize("bad", [["only one"], ["a", "b", "c"], ["a", 3], 7, None])
def test_example_texts_of_the_wrong_count_or_type_are_refused(tiny_model, bad):
    from nope_interp.analysis import analyze_tokens
    from nope_interp.errors import NopeInterpError

    with pytest.raises(NopeInterpError, match="example_prompt must be a string .* or one string per sequence"
                                              + (r".*not all strings \(int\)" if bad == ["a", 3] else "")):
        unhooked(analyze_tokens)(tiny_model, torch.stack([torch.arange(8), torch.arange(8) + 9]), example_prompt=bad)


def test_cli_analyze_heatmap_of_a_text_file_starting_with_a_repeated_character(tiny_run, tmp_path, capsys):
    """The figure of `analyze --text-file` whose first window is one repeated character draws the next window
    and says so in its title."""
    from nope_interp.cli import main

    text = tmp_path / "a.txt"
    text.write_text("a" * 8 + "To be, or not to be, that is the question.")
    out = tmp_path / "out"
    assert main(["analyze", "--run", str(tiny_run), "--text-file", str(text), "--text-length", "8",
                 "--out-root", str(out)]) == 0
    capsys.readouterr()
    (page,) = [p for p in out.rglob("*.html") if "cosine" in p.name]
    html = page.read_text()
    assert "To be, o" in html and "input 1 (0-based; the first with an order to draw" in html
