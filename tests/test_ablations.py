import pytest
import torch
from conftest import assert_no_hooks


@pytest.fixture
def AB():
    import nope_interp.ablations as ablations

    return ablations


def test_projection_is_idempotent_and_removes_exactly_the_subspace(AB):
    gen = torch.Generator().manual_seed(0)
    mu = torch.randn(9, 16, generator=gen, dtype=torch.float64)
    basis = AB.positional_subspace(mu, 3)
    torch.testing.assert_close(basis.T @ basis, torch.eye(3, dtype=torch.float64))
    h = torch.randn(5, 9, 16, generator=gen, dtype=torch.float64)
    once = AB.project_out(h, basis)
    torch.testing.assert_close(AB.project_out(once, basis), once)
    torch.testing.assert_close(once @ basis, torch.zeros(5, 9, 3, dtype=torch.float64), atol=1e-12, rtol=0)
    # the removed part lies in the subspace: h - once = (h B) B^T
    torch.testing.assert_close(h - once, (h @ basis) @ basis.T)
    # the top directions of the centred means: compare with numpy's SVD, up to sign
    import numpy as np

    centred = (mu - mu.mean(0)).numpy()
    vt = np.linalg.svd(centred, full_matrices=False)[2][:3]
    assert np.allclose(np.abs(vt @ basis.numpy()), np.eye(3), atol=1e-8)
    rand = AB.random_subspace(16, 4, gen)
    torch.testing.assert_close(rand.T @ rand, torch.eye(4, dtype=torch.float64))


def test_shuffle_positional_keeps_content_and_permutes_means(AB):
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(4, 6, 8, generator=gen, dtype=torch.float64)
    mu = AB.positional_means(h)
    perm = torch.tensor([3, 0, 5, 1, 2, 4])
    hook = AB.ablation_hook("shuffle_positional", mu, perm=perm)
    out = hook(torch.cat([h, torch.ones(4, 2, 8, dtype=torch.float64)], dim=1), hook=None)
    assert torch.equal(out[:, 6:], torch.ones(4, 2, 8, dtype=torch.float64))  # generated positions untouched
    torch.testing.assert_close(out[:, :6] - mu[perm], h - mu)  # content h - mu kept, mean permuted
    torch.testing.assert_close(AB.positional_means(out[:, :6]), mu[perm])
    mean_out = AB.ablation_hook("mean_positional", mu)(h, hook=None)
    torch.testing.assert_close(AB.positional_means(mean_out), mu.mean(0).expand(6, 8))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("kind", ["shuffle_positional", "shuffle_vectors"])
def test_a_permutation_of_any_integer_dtype_permutes_positions(AB, kind, dtype):
    """Before: a uint8 perm was read by torch as a boolean mask (shuffle_vectors dropped a position: (3, 2, 4)
    out of 3 positions; shuffle_positional differed from the int64 perm by 1.28) and int8 / int16 perms raised
    a raw IndexError inside the hook. Checked against a naive loop over positions."""
    gen = torch.Generator().manual_seed(2)
    h = torch.randn(3, 5, 4, generator=gen, dtype=torch.float64)
    mu = AB.positional_means(h)
    order = [1, 2, 0, 4, 3]
    out = AB.ablation_hook(kind, mu, perm=torch.tensor(order, dtype=dtype))(h.clone(), hook=None)
    assert out.shape == h.shape
    for p, q in enumerate(order):
        want = h[:, q] if kind == "shuffle_vectors" else h[:, p] - mu[p] + mu[q]
        torch.testing.assert_close(out[:, p], want)


def test_the_random_shift_control_matches_the_mean_ablation_in_size_not_direction(AB):
    """mean_positional_random moves position p by exactly as much as mean_positional does (|mean mu - mu[p]|, by
    a naive per-position loop), in a random direction drawn once per hook (so the same on every call, another
    with another generator state), and leaves generated positions alone; a model with no positional
    structure (mu equal at every position) is not moved at all."""
    from nope_interp.errors import NopeInterpError

    gen = torch.Generator().manual_seed(4)
    h = torch.randn(5, 7, 12, generator=gen, dtype=torch.float64)
    mu = AB.positional_means(h)
    mean_hook = AB.ablation_hook("mean_positional", mu)
    hook = AB.ablation_hook("mean_positional_random", mu, generator=torch.Generator().manual_seed(0))
    tail = torch.ones(5, 2, 12, dtype=torch.float64)
    out = hook(torch.cat([h, tail], dim=1), hook=None)
    assert torch.equal(out[:, 7:], tail)
    moved, mean_moved = out[:, :7] - h, mean_hook(h, hook=None) - h
    for p in range(7):
        size = float(torch.sqrt(sum((mu.mean(0)[i] - mu[p, i]) ** 2 for i in range(12))))
        for b in range(5):
            assert float(moved[b, p].norm()) == pytest.approx(size, rel=1e-9)
            assert float(mean_moved[b, p].norm()) == pytest.approx(size, rel=1e-9)
        cos = float(moved[0, p] @ mean_moved[0, p]) / size**2
        assert abs(cos) < 0.95  # another direction
    torch.testing.assert_close(hook(h, hook=None), out[:, :7])  # drawn once, not per call
    other = AB.ablation_hook("mean_positional_random", mu, generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(other(h, hook=None), out[:, :7])
    flat = torch.zeros(7, 12, dtype=torch.float64) + mu.mean(0)
    torch.testing.assert_close(AB.ablation_hook("mean_positional_random", flat, generator=gen)(h, hook=None), h)
    with pytest.raises(NopeInterpError, match="'mean_positional_random' needs a torch.Generator"):
        AB.ablation_hook("mean_positional_random", mu)
    with pytest.raises(NopeInterpError, match="acts on the 7 prompt positions of mu"):
        hook(h[:, :4], hook=None)


def test_the_content_subspace_is_the_top_principal_directions_of_h_minus_mu(AB):
    """Against numpy: the top right singular vectors of the stacked content rows h[b, p] - mu[p] (up to sign);
    the basis holds the largest content variance any r directions can (the sum of the top r squared singular
    values, more than a random subspace holds), and a position-only input has no content to span."""
    import numpy as np

    from nope_interp.errors import NopeInterpError

    gen = torch.Generator().manual_seed(5)
    h = torch.randn(6, 5, 10, generator=gen, dtype=torch.float64) * torch.linspace(0.2, 3.0, 10, dtype=torch.float64)
    h = h + torch.randn(5, 10, generator=gen, dtype=torch.float64) * 4  # a positional part
    basis = AB.content_subspace(h, 3)
    torch.testing.assert_close(basis.T @ basis, torch.eye(3, dtype=torch.float64))
    mu = h.numpy().mean(0)
    rows = np.concatenate([h.numpy()[b] - mu for b in range(6)])
    _, sv, vt = np.linalg.svd(rows, full_matrices=False)
    assert np.allclose(np.abs(vt[:3] @ basis.numpy()), np.eye(3), atol=1e-8)
    held = float(((rows @ basis.numpy()) ** 2).sum())
    assert held == pytest.approx(float((sv[:3] ** 2).sum()), rel=1e-9)
    rand = AB.random_subspace(10, 3, gen).numpy()
    assert held > float(((rows @ rand) ** 2).sum())
    flat = torch.randn(1, 5, 10, generator=gen, dtype=torch.float64).expand(4, 5, 10)
    with pytest.raises(NopeInterpError, match="content part spans 0 direction"):
        AB.content_subspace(flat, 1)
    with pytest.raises(NopeInterpError, match="batch >= 2"):
        AB.content_subspace(h[:1], 1)
    with pytest.raises(NopeInterpError, match=r"rank must be an integer in \[0, 10\]"):
        AB.content_subspace(h, 11)
    hook = AB.ablation_hook("project_out_content", AB.positional_means(h), basis=basis)
    torch.testing.assert_close(hook(h, hook=None), AB.project_out(h, basis))


def test_rank_zero_and_identity_permutation_leave_logits_unchanged(AB, tiny_model):
    tokens = torch.randint(0, 96, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        clean = tiny_model(tokens)
        _, cache = tiny_model.run_with_cache(tokens, names_filter="blocks.1.hook_resid_pre")
    mu = AB.positional_means(cache["blocks.1.hook_resid_pre"])
    for hook in (AB.ablation_hook("project_out", mu, basis=AB.positional_subspace(mu, 0)),
                 AB.ablation_hook("shuffle_positional", mu, perm=torch.arange(9)),
                 AB.ablation_hook("shuffle_vectors", mu, perm=torch.arange(9))):
        with torch.no_grad():
            out = tiny_model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_pre", hook)])
        torch.testing.assert_close(out, clean, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        changed = tiny_model.run_with_hooks(tokens, fwd_hooks=[(
            "blocks.1.hook_resid_pre", AB.ablation_hook("shuffle_vectors", mu, perm=torch.arange(9).flip(0)))])
    assert (changed - clean).abs().max() > 1e-4
    assert_no_hooks(tiny_model)


def test_no_hook_left_after_a_run_that_raised(AB, tiny_model):
    mu = torch.zeros(5, tiny_model.cfg.d_model, dtype=torch.float64)

    def boom(resid, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tiny_model.run_with_hooks(torch.zeros(1, 5, dtype=torch.long), fwd_hooks=[("blocks.0.hook_resid_pre", boom)])
    assert_no_hooks(tiny_model)
    with pytest.raises(RuntimeError, match="boom"):
        with tiny_model.hooks(fwd_hooks=[("blocks.0.hook_resid_post", AB.ablation_hook("mean_positional", mu))]):
            tiny_model(torch.zeros(1, 5, dtype=torch.long))
            raise RuntimeError("boom")
    assert_no_hooks(tiny_model)


def test_bad_ablation_input(AB):
    from nope_interp.errors import NopeInterpError

    mu = torch.zeros(5, 4, dtype=torch.float64)
    with pytest.raises(NopeInterpError, match="allowed: shuffle_positional"):
        AB.ablation_hook("zero", mu)
    with pytest.raises(NopeInterpError, match="needs perm"):
        AB.ablation_hook("shuffle_positional", mu)
    with pytest.raises(NopeInterpError, match="rank must be an integer in \\[0, 4\\]"):
        AB.positional_subspace(mu, 5)


def test_ablation_inputs_that_would_give_garbage_numbers_are_refused(AB):
    """Before: a 1-D mu, a perm that is not a permutation, an integer h (the basis cast to 0) and a
    non-orthonormal basis were accepted, and a constant mu gave an arbitrary 'positional' basis."""
    import numpy as np
    from conftest import unhooked

    from nope_interp.errors import NopeInterpError

    gen = torch.Generator().manual_seed(0)
    mu = torch.randn(8, 6, generator=gen, dtype=torch.float64)
    acts = torch.randn(3, 8, 6, generator=gen)
    basis = AB.positional_subspace(mu, 2)
    U = unhooked
    cases = [
        (lambda: U(AB.ablation_hook)("mean_positional", mu[0]), "mu must be a real floating torch tensor of shape"),
        (lambda: U(AB.ablation_hook)("shuffle_positional", mu, perm=torch.zeros(8, dtype=torch.long)),
         "perm must be a permutation of range\\(8\\)"),
        (lambda: U(AB.ablation_hook)("shuffle_vectors", mu, perm=torch.arange(7)), "permutation of range\\(8\\)"),
        (lambda: U(AB.ablation_hook)("shuffle_positional", mu, perm=torch.arange(8.0)), "permutation"),
        (lambda: U(AB.ablation_hook)("project_out", mu, basis=torch.ones(6, 1)), "orthonormal columns"),
        (lambda: U(AB.ablation_hook)("project_out", mu, basis=torch.eye(5)[:, :2]), "d_model=6 rows"),
        (lambda: U(AB.ablation_hook)("swap_prompts", mu, generator=0), "torch.Generator"),
        (lambda: U(AB.project_out)(torch.ones(2, 6, dtype=torch.long), basis), "h must be a real floating"),
        (lambda: U(AB.project_out)(acts, torch.ones(6, 1)), "orthonormal"),
        (lambda: U(AB.positional_subspace)(torch.ones(8, 6), 2), "span 0 direction\\(s\\)"),
        (lambda: U(AB.positional_subspace)(mu, 2.5), "rank must be an integer"),
        (lambda: U(AB.positional_subspace)(mu, True), "rank must be an integer"),
        (lambda: U(AB.random_subspace)(6.0, 2, gen), "d_model must be an integer"),
        (lambda: U(AB.random_subspace)(6, 2, None), "torch.Generator"),
        (lambda: U(AB.positional_decomposition)(acts, rel_zero=-1), "rel_zero"),
        (lambda: U(AB.positional_decomposition)(acts, rel_zero=float("nan")), "rel_zero"),
        (lambda: U(AB.positional_means)(acts.numpy()), "torch tensor"),
    ]
    for call, words in cases:
        with pytest.raises(NopeInterpError, match=words):
            call()
    # good input: numpy integers for sizes, and the projection removes exactly the basis directions
    q = unhooked(AB.random_subspace)(np.int64(6), np.int64(2), gen)   # as users call it (no type checker)
    out = AB.project_out(acts.double(), q)
    assert float((out @ q).abs().max()) < 1e-12
    torch.testing.assert_close(out + (acts.double() @ q) @ q.T, acts.double())


def test_positional_decomposition_separates_position_from_content(AB):
    import numpy as np

    gen = torch.Generator().manual_seed(5)
    n_b, n_p, d = 64, 12, 256
    walk = torch.randn(n_p, d, generator=gen, dtype=torch.float64).cumsum(0)  # mu: a random walk (adjacent)
    content = 0.7 * torch.randn(n_b, n_p, d, generator=gen, dtype=torch.float64)  # i.i.d.: no adjacency
    content[:, 0] = 0.0  # a fixed first token: the same vector in every prompt
    out = AB.positional_decomposition(walk + content)
    assert out["dropped_positions"] == [0]
    assert out["adjacency_positional"] > 0.9
    assert abs(out["adjacency_content"] - 0.5) < 0.05
    # variance fraction against a naive numpy loop (law of total variance), on positions 1.. (position 0 dropped)
    h = (walk + content).numpy()[:, 1:]
    n_p -= 1
    grand = h.reshape(-1, d).mean(0)
    total = np.mean([np.sum((h[b, p] - grand) ** 2) for b in range(n_b) for p in range(n_p)])
    mus = [h[:, p].mean(0) for p in range(n_p)]
    between = np.mean([np.sum((m - grand) ** 2) for m in mus])
    assert out["positional_variance_fraction"] == pytest.approx(between / total, rel=1e-10)
    # pure content (no positional signal): fraction near 0, positional mean not adjacent
    noise = torch.randn(n_b, n_p, d, generator=gen, dtype=torch.float64)
    flat = AB.positional_decomposition(noise)
    assert flat["positional_variance_fraction"] < 0.05 and flat["dropped_positions"] == []
    # a constant position in the middle (a fixed token the model maps to one vector) is dropped too
    mid = walk + content
    mid[:, 5] = mid[0, 5]
    assert AB.positional_decomposition(mid)["dropped_positions"] == [0, 5]
    # the message names the function (ablate reports it as a site's error, away from the call)
    with pytest.raises(AB.NopeInterpError, match=r"^positional_decomposition: fewer than 3 of the 5 positions"):
        AB.positional_decomposition(torch.zeros(4, 5, 3, dtype=torch.float64) + 1.0)
    few = mid.clone()
    few[:, 2:] = few[0, 2:]  # positions 0 and 2-11 fixed: only position 1 is usable
    with pytest.raises(AB.NopeInterpError, match=r"fewer than 3 of the 12 positions .*usable: \[1\]"):
        AB.positional_decomposition(few)


def test_a_hook_applied_to_other_activations_than_it_was_built_for_says_so(AB):
    """A hook built with mu of 22 positions, run on 5, failed with "size of tensor a (5) must match (22)"."""
    from nope_interp.errors import NopeInterpError

    gen = torch.Generator().manual_seed(3)
    h = torch.randn(2, 6, 8, generator=gen, dtype=torch.float64)
    mu = AB.positional_means(h)
    hooks = {"mean_positional": AB.ablation_hook("mean_positional", mu),
             "shuffle_positional": AB.ablation_hook("shuffle_positional", mu, perm=torch.arange(6).flip(0)),
             "shuffle_vectors": AB.ablation_hook("shuffle_vectors", mu, perm=torch.arange(6).flip(0)),
             "project_out": AB.ablation_hook("project_out", mu, basis=AB.positional_subspace(mu, 2))}
    for kind, hook in hooks.items():
        with pytest.raises(NopeInterpError, match=f"ablation hook '{kind}' was built for d_model=8"):
            hook(torch.randn(2, 6, 5, dtype=torch.float64), hook=None)
        short = torch.randn(2, 4, 8, generator=gen, dtype=torch.float64)
        if kind == "project_out":  # acts per position: a shorter sequence is fine
            torch.testing.assert_close(hook(short, hook=None), AB.project_out(short, AB.positional_subspace(mu, 2)))
        else:
            with pytest.raises(NopeInterpError, match="acts on the 6 prompt positions of mu, applied to a sequence "
                                                      "of 4 positions"):
                hook(short, hook=None)
        assert hook(h, hook=None).shape == h.shape  # the length it was built for still works


def test_derangement_moves_every_element_and_is_uniform_enough():
    import collections

    from nope_interp.ablations import derangement
    from nope_interp.errors import NopeInterpError

    gen = torch.Generator().manual_seed(0)
    for n in (2, 3, 5, 17):
        for _ in range(20):
            p = derangement(n, gen)
            assert sorted(p.tolist()) == list(range(n)) and all(p[i] != i for i in range(n))
    # n = 3 has exactly two derangements, (1, 2, 0) and (2, 0, 1): both drawn about equally often
    counts = collections.Counter(tuple(derangement(3, gen).tolist()) for _ in range(400))
    assert set(counts) == {(1, 2, 0), (2, 0, 1)} and min(counts.values()) > 150
    from conftest import unhooked

    for bad in (1, 0, 2.0, True):  # bad types past the test-time type checker, as a user without it sees them
        with pytest.raises(NopeInterpError, match="n must be an integer >= 2"):
            unhooked(derangement)(bad, gen)


def test_swap_prompts_gives_every_prompt_another_prompts_vectors_and_keeps_its_donors():
    """Before: a fresh permutation on every forward pass (greedy decoding without a cache runs one per new
    token, so each answer token saw other donors) that could leave a prompt in place, or all of it for a batch
    of one."""
    from nope_interp.ablations import ablation_hook
    from nope_interp.errors import NopeInterpError

    mu = torch.zeros(4, 3, dtype=torch.float64)
    hook = ablation_hook("swap_prompts", mu, generator=torch.Generator().manual_seed(1))
    h = torch.arange(6, dtype=torch.float64)[:, None, None].expand(6, 5, 3).clone()  # prompt i holds i everywhere
    first = hook(h)
    donors = first[:, 0, 0]
    assert all(donors[i] != i for i in range(6)) and sorted(donors.tolist()) == list(range(6))
    assert torch.equal(first[:, :4], donors[:, None, None].expand(6, 4, 3)) and torch.equal(first[:, 4:], h[:, 4:])
    for _ in range(3):  # the same batch again (the next decoding step, one position longer): the same donors
        longer = torch.cat([h, h[:, :1]], dim=1)
        assert torch.equal(hook(longer)[:, 0, 0], donors)
    with pytest.raises(NopeInterpError, match="at least 2 prompts"):
        hook(h[:1])


def test_a_16_bit_basis_is_told_to_use_float32_not_qr():
    """A float16 or bfloat16 basis off only by its rounding was told to orthonormalise itself with
    torch.linalg.qr, which cannot bring 16-bit columns within the tolerance; a basis that is not orthonormal
    (any dtype) still gets the qr advice."""
    from nope_interp.ablations import check_basis
    from nope_interp.errors import NopeInterpError

    q = torch.linalg.qr(torch.randn(64, 4, generator=torch.Generator().manual_seed(0)))[0]
    for dtype in (torch.float16, torch.bfloat16):
        with pytest.raises(NopeInterpError, match=r"\(16-bit rounding alone: give the basis in float32 or float64"):
            check_basis(q.to(dtype), 64, "project_out")
        with pytest.raises(NopeInterpError, match=r"orthonormalise it with torch.linalg.qr"):   # not rounding
            check_basis((2 * q).to(dtype), 64, "project_out")
        assert torch.equal(check_basis(torch.eye(64)[:, :4].to(dtype), 64, "project_out"),
                           torch.eye(64, dtype=torch.float64)[:, :4])   # exactly representable: accepted
    assert torch.allclose(check_basis(q, 64, "project_out"), q.double())
    with pytest.raises(NopeInterpError, match=r"orthonormalise it with torch.linalg.qr"):
        check_basis(2 * q, 64, "project_out")


@pytest.mark.parametrize(("kind", "arg"), [
    ("project_out", "perm"), ("project_out_random", "perm"), ("project_out_content", "generator"),
    ("mean_positional", "perm"), ("mean_positional", "basis"), ("shuffle_positional", "basis"),
    ("shuffle_vectors", "generator"), ("swap_prompts", "perm"), ("mean_positional_random", "basis"),
])
def test_ablation_hook_refuses_an_argument_its_kind_does_not_use(AB, kind, arg):
    """Before: ``perm=`` given to ``project_out`` (or a basis to a shuffle) was silently ignored, so a careless
    call ran another ablation than the one it meant."""
    mu = torch.randn(6, 8, dtype=torch.float64)
    needs = {"shuffle_positional": {"perm": torch.arange(6).flip(0)}, "shuffle_vectors": {"perm": torch.arange(6)},
             "project_out": {"basis": AB.positional_subspace(mu, 1)},
             "project_out_random": {"basis": AB.positional_subspace(mu, 1)},
             "project_out_content": {"basis": AB.positional_subspace(mu, 1)},
             "swap_prompts": {"generator": torch.Generator()},
             "mean_positional_random": {"generator": torch.Generator()},
             "mean_positional": {}}[kind]
    AB.ablation_hook(kind, mu, **needs)  # what it needs is accepted
    extra = {"perm": torch.arange(6), "basis": AB.positional_subspace(mu, 1), "generator": torch.Generator()}[arg]
    with pytest.raises(AB.NopeInterpError, match=f"{arg}= is not used by ablation '{kind}'"):
        AB.ablation_hook(kind, mu, **needs, **{arg: extra})
