"""Tests of MaskedDecoder against a literal, one-network-pass-per-feature
reference of mu_ij = f(w_j * z_i)_j."""

import pytest
import torch

from pyro_sparse.nn import MaskedDecoder

G, K, HIDDEN, BATCH = 7, 3, (8, 6), 5


def reference_forward(decoder, z, mask):
    """For each feature j: run the whole shared network on z * W[j] and keep
    output j.  Written from the definition, using the decoder's parameters."""
    first = decoder.first_weight / decoder.first_weight.norm(dim=0, keepdim=True)
    outputs = []
    for j in range(decoder.num_features):
        x = z * mask[j]                                  # (..., B, K)
        h = torch.relu(x @ first.T + decoder.first_bias)
        for layer in decoder.hidden:
            h = torch.relu(h @ layer.weight.T + layer.bias)
        full = h @ decoder.out_weight.T + decoder.out_bias  # (..., B, G): all outputs
        outputs.append(full[..., j])
    out = torch.stack(outputs, dim=-1)
    affine = getattr(decoder, "output_affine", None)  # fixed per-feature x * scale + loc
    if affine is not None:
        out = out * affine.scale + affine.loc
    return out


def make(dtype=torch.float32, seed=0, memory_budget_bytes=2**28, hidden=HIDDEN):
    torch.manual_seed(seed)
    decoder = MaskedDecoder(G, K, hidden, memory_budget_bytes=memory_budget_bytes).to(dtype)
    with torch.no_grad():
        decoder.out_bias.normal_()           # default is zeros; make it matter
        for p in decoder.parameters():
            p.mul_(1.5)                       # fewer dead ReLUs, non-unit first-layer columns
    if hasattr(decoder, "output_affine"):
        decoder.output_affine.set(torch.randn(G), torch.rand(G) + 0.5)
    z = torch.randn(BATCH, K, dtype=dtype)
    mask = torch.randn(G, K, dtype=dtype)
    mask[1, 2] = 0.0
    return decoder, z, mask


def grads(decoder, z, mask, fn, weights=None):
    z = z.detach().clone().requires_grad_(True)
    mask = mask.detach().clone().requires_grad_(True)
    params = list(decoder.parameters())
    out = fn(decoder, z, mask)
    if weights is None:
        torch.manual_seed(123)
        weights = torch.randn(out.shape, dtype=out.dtype)  # randn_like follows strides
    return out, torch.autograd.grad((out * weights).sum(), [z, mask] + params)


def assert_same_outputs_and_gradients(decoder, other, z, mask, tol=1e-6):
    """Two decoders with the same parameters give the same outputs and gradients."""
    out, g = grads(decoder, z, mask, lambda d, z, m: d(z, m))
    out_o, g_o = grads(other, z, mask, lambda d, z, m: d(z, m))
    torch.testing.assert_close(out, out_o, atol=tol, rtol=tol)
    names = ["z", "mask"] + [n for n, _ in decoder.named_parameters()]
    for name, a, b in zip(names, g, g_o):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol, msg=lambda m, name=name: f"grad of {name}: {m}")


# ----------------------------------------------------------------- values ---
def test_forward_matches_reference():
    decoder, z, mask = make()
    assert decoder.chunk_size(BATCH) >= G  # single-chunk path
    out = decoder(z, mask)
    assert out.shape == (BATCH, G)
    expected = reference_forward(decoder, z, mask)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    # The comparison is not vacuous: outputs vary over features and data.
    assert expected.std(0).min() > 1e-3 and expected.std(1).min() > 1e-3


def test_forward_leading_sample_dim():
    decoder, _, mask = make()
    torch.manual_seed(1)
    z = torch.randn(2, BATCH, K)
    out = decoder(z, mask)
    assert out.shape == (2, BATCH, G)
    torch.testing.assert_close(out, reference_forward(decoder, z, mask), atol=1e-5, rtol=1e-5)
    # Same as decoding each sample separately.
    torch.testing.assert_close(out[1], decoder(z[1], mask), atol=1e-6, rtol=1e-6)


def test_forward_single_hidden_layer_and_three_layers():
    for hidden in [(10,), (5, 4, 3)]:
        decoder, z, mask = make(hidden=hidden, seed=2)
        torch.testing.assert_close(decoder(z, mask), reference_forward(decoder, z, mask),
                                   atol=1e-5, rtol=1e-5)


def test_output_affine():
    decoder, z, mask = make(seed=13)
    if not hasattr(decoder, "output_affine"):
        pytest.skip("MaskedDecoder has no output_affine")
    out = decoder(z, mask)
    loc, scale = decoder.output_affine.loc.clone(), decoder.output_affine.scale.clone()
    assert not torch.allclose(scale, torch.ones(G))
    decoder.output_affine.set(torch.zeros(G), torch.ones(G))
    raw = decoder(z, mask)
    torch.testing.assert_close(out, raw * scale + loc, atol=1e-5, rtol=1e-5)
    # The affine map is fixed: buffers in the state dict, not parameters.
    names = {n for n, _ in decoder.named_parameters()}
    assert not any("output_affine" in n for n in names)
    assert "output_affine.loc" in decoder.state_dict()


def test_empty_hidden_dims_rejected():
    with pytest.raises(ValueError):
        MaskedDecoder(G, K, ())


# -------------------------------------------------------------- gradients ---
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_match_reference(dtype):
    decoder, z, mask = make(dtype=dtype, seed=3)
    out, g = grads(decoder, z, mask, lambda d, z, m: d(z, m))
    ref, g_ref = grads(decoder, z, mask, reference_forward)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)
    names = ["z", "mask"] + [n for n, _ in decoder.named_parameters()]
    assert {"first_weight", "first_bias", "out_weight", "out_bias"} <= set(names)
    for name, a, b in zip(names, g, g_ref):
        torch.testing.assert_close(
            a, b, atol=tol, rtol=tol, msg=lambda m, name=name: f"grad of {name}: {m}"
        )
        assert b.abs().sum() > 0, name  # every parameter actually receives gradient


def test_gradcheck_float64():
    decoder, z, mask = make(dtype=torch.float64, seed=4)
    z = z.clone().requires_grad_(True)
    mask = mask.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z, m: decoder(z, m), (z, mask), fast_mode=True)


# ------------------------------------------------------------ chunked path ---
@pytest.mark.parametrize("budget", [1, 3 * BATCH * sum(HIDDEN) * 8])
def test_chunked_matches_unchunked(budget):
    decoder, z, mask = make(seed=5)
    chunked = MaskedDecoder(G, K, HIDDEN, memory_budget_bytes=budget)
    chunked.load_state_dict(decoder.state_dict())
    size = chunked.chunk_size(BATCH)
    assert size < G
    assert size == (1 if budget == 1 else 3)  # 3 gives uneven chunks 3 + 3 + 1
    assert decoder.chunk_size(BATCH) >= G

    assert_same_outputs_and_gradients(chunked, decoder, z, mask)

    # Leading sample dim through the chunked path.
    torch.manual_seed(6)
    z2 = torch.randn(2, BATCH, K)
    torch.testing.assert_close(chunked(z2, mask), decoder(z2, mask), atol=1e-6, rtol=1e-6)

    with torch.no_grad():
        torch.testing.assert_close(chunked(z, mask), decoder(z, mask), atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(chunked(z, mask), reference_forward(decoder, z, mask),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("features_per_block", [1, 3])
def test_cpu_blocks_match_one_block(features_per_block):
    decoder, z, mask = make(seed=7)
    blocked = MaskedDecoder(G, K, HIDDEN, block_bytes=features_per_block * 4 * max(HIDDEN) * BATCH)
    blocked.load_state_dict(decoder.state_dict())
    assert blocked.block_features(BATCH) == features_per_block  # 3 gives uneven blocks 3 + 3 + 1
    assert decoder.block_features(BATCH) >= G
    assert_same_outputs_and_gradients(blocked, decoder, z, mask)


def test_chunk_size_scales_with_batch():
    decoder = MaskedDecoder(G, K, HIDDEN, memory_budget_bytes=4 * 10 * sum(HIDDEN) * 8)
    assert decoder.chunk_size(10) == 4
    assert decoder.chunk_size(20) == 2
    assert decoder.chunk_size(10**6) == 1
    assert decoder.chunk_size(1) == G


def test_chunked_backward_twice_and_optimizer_step():
    # Checkpointed chunks must support a normal training step.
    decoder, z, mask = make(seed=7)
    chunked = MaskedDecoder(G, K, HIDDEN, memory_budget_bytes=1)
    chunked.load_state_dict(decoder.state_dict())
    mask_c = torch.nn.Parameter(mask.clone())
    mask_u = torch.nn.Parameter(mask.clone())
    opt_c = torch.optim.SGD(list(chunked.parameters()) + [mask_c], lr=0.1)
    opt_u = torch.optim.SGD(list(decoder.parameters()) + [mask_u], lr=0.1)
    for _ in range(3):
        for dec, m, opt in [(chunked, mask_c, opt_c), (decoder, mask_u, opt_u)]:
            opt.zero_grad()
            (dec(z, m) ** 2).mean().backward()
            opt.step()
    torch.testing.assert_close(mask_c.detach(), mask_u.detach(), atol=1e-6, rtol=1e-6)
    for (n, a), (_, b) in zip(chunked.named_parameters(), decoder.named_parameters()):
        torch.testing.assert_close(
            a.detach(), b.detach(), atol=1e-6, rtol=1e-6, msg=lambda m, n=n: f"{n}: {m}"
        )


# ------------------------------------------------ first-layer normalisation ---
def test_first_layer_columns_unit_norm():
    decoder, _, _ = make(seed=8)
    w = decoder.normalized_first_weight()
    assert w.shape == (HIDDEN[0], K)
    torch.testing.assert_close(w.norm(dim=0), torch.ones(K), atol=1e-6, rtol=0)
    # The raw weight is not unit norm, so the normalisation does something.
    assert (decoder.first_weight.norm(dim=0) - 1).abs().max() > 1e-2


def test_scaling_first_weight_does_not_change_output():
    decoder, z, mask = make(seed=9)
    before = decoder(z, mask)
    with torch.no_grad():
        decoder.first_weight.mul_(7.5)
    torch.testing.assert_close(decoder(z, mask), before, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        decoder.first_weight.mul_(torch.tensor([0.1, 3.0, 20.0]))  # per-column scaling
    torch.testing.assert_close(decoder(z, mask), before, atol=1e-5, rtol=1e-5)
    # ... whereas scaling W itself does change it (the scale lives in W).
    assert not torch.allclose(decoder(z, 2 * mask), before, atol=1e-3)


def test_first_weight_gradient_orthogonal_to_columns():
    # With normalised columns the loss is invariant to each column's scale, so
    # the gradient of first_weight is orthogonal to each of its columns.
    decoder, z, mask = make(dtype=torch.float64, seed=10)
    loss = (decoder(z, mask) ** 2).sum()
    (g,) = torch.autograd.grad(loss, decoder.first_weight)
    assert g.abs().max() > 1e-6
    torch.testing.assert_close((g * decoder.first_weight).sum(0),
                               torch.zeros(K, dtype=torch.float64), atol=1e-10, rtol=0)


# ------------------------------------------------------------ zero mask row ---
@pytest.mark.parametrize("budget", [2**28, 1])
def test_zero_mask_row_output_independent_of_z(budget):
    decoder, _, mask = make(seed=11, memory_budget_bytes=budget)
    mask = mask.clone()
    mask[4] = 0.0
    torch.manual_seed(12)
    z = torch.randn(64, K) * 3
    z_req = z.clone().requires_grad_(True)
    out = decoder(z_req, mask)
    # Feature 4 is the same for every data point: f(0)_4.
    assert (out[:, 4] - out[0, 4]).abs().max().item() == 0.0
    expected = reference_forward(decoder, torch.zeros(1, K), mask)[0, 4]
    torch.testing.assert_close(out[0, 4], expected, atol=1e-6, rtol=1e-6)
    (gz,) = torch.autograd.grad(out[:, 4].sum(), z_req)
    assert torch.equal(gz, torch.zeros_like(gz))
    # Other features do depend on z.
    assert out[:, 3].std() > 1e-3
    # Zeroing one entry w_jk removes the dependence of feature j on z_k only.
    mask[2, 1] = 0.0
    z_req = z.clone().requires_grad_(True)
    (gz,) = torch.autograd.grad(decoder(z_req, mask)[:, 2].sum(), z_req)
    assert torch.equal(gz[:, 1], torch.zeros(64))
    assert gz[:, [0, 2]].abs().sum() > 0


# ------------------------------------------------------------------- gain ---
def test_unknown_gain_rejected():
    with pytest.raises(ValueError, match="decoder_gain"):
        MaskedDecoder(G, K, HIDDEN, gain="unit")


@pytest.mark.parametrize("gain", ["free", "fixed"])
def test_smaller_w_is_undone_only_by_a_free_gain(gain):
    """
    ReLU is positively homogeneous: W * c with every bias * c scales the outputs
    by c, for either gain.  W * c with the first bias * c and the next layer / c
    is the same network when the gain is free (W can shrink at no cost in
    likelihood); with a fixed gain the next layer is normalised back and the outputs change.
    """
    free, z, mask = make(dtype=torch.float64)
    decoder = MaskedDecoder(G, K, HIDDEN, gain=gain).double()
    decoder.load_state_dict(free.state_dict())
    decoder.output_affine.set(torch.zeros(G), torch.ones(G))
    before = decoder(z, mask)
    state = {k: v.clone() for k, v in decoder.state_dict().items()}
    with torch.no_grad():
        for bias in [decoder.first_bias, decoder.out_bias] + [layer.bias for layer in decoder.hidden]:
            bias.mul_(0.1)
    torch.testing.assert_close(decoder(z, 0.1 * mask), 0.1 * before)
    decoder.load_state_dict(state)
    with torch.no_grad():
        decoder.first_bias.mul_(0.1)
        decoder.hidden[0].weight.div_(0.1)
    traded = decoder(z, 0.1 * mask)
    if gain == "free":
        torch.testing.assert_close(traded, before)
    else:
        assert (traded - before).abs().max() > 0.1 * before.abs().max()


@pytest.mark.parametrize("budget, block, subset, covariates", [
    (2**28, 2**20, False, False),   # one chunk, one block
    (1, 2**20, False, False),       # one feature per chunk, recomputed in backward
    (2**28, 1, False, False),       # one feature per block
    (2**28, 2**20, True, True),     # feature subsampling and covariates
])
def test_fixed_gain_forward_ignores_the_raw_scale_of_later_rows(budget, block, subset, covariates):
    """
    With gain="fixed" every path of the forward pass uses the normalised rows: scaling any later
    hidden row or output row leaves the outputs and W's gradient unchanged.
    """
    torch.manual_seed(0)
    decoder = MaskedDecoder(G, K, HIDDEN, memory_budget_bytes=budget, block_bytes=block, gain="fixed",
                            covariate_dim=2 if covariates else 0).double()
    z, mask = torch.randn(BATCH, K, dtype=torch.float64), torch.randn(G, K, dtype=torch.float64, requires_grad=True)
    kwargs = {"features": torch.tensor([4, 0, 5]) if subset else None,
              "covariates": torch.randn(BATCH, 2, dtype=torch.float64) if covariates else None}

    def outputs_and_gradient():
        out = decoder(z, mask, **kwargs)
        return out.detach(), torch.autograd.grad(out.sin().sum(), mask)[0]

    before, gradient = outputs_and_gradient()
    with torch.no_grad():
        for layer in decoder.hidden:
            layer.weight.mul_(torch.rand(layer.weight.shape[0], 1, dtype=torch.float64) * 5 + 0.1)
        decoder.out_weight.mul_(torch.rand(G, 1, dtype=torch.float64) * 5 + 0.1)
    after, gradient_after = outputs_and_gradient()
    torch.testing.assert_close(after, before)
    torch.testing.assert_close(gradient_after, gradient)


def test_fixed_gain_row_norms():
    """The forward pass uses later hidden rows of norm sqrt(2) and output rows of norm 1, whatever the raw weights."""
    decoder = MaskedDecoder(G, K, HIDDEN, gain="fixed")
    with torch.no_grad():
        decoder.hidden[0].weight.mul_(7.0)
        decoder.out_weight.mul_(0.01)
    hidden, out_weight = decoder.layer_weights()
    for weight, _ in hidden:
        torch.testing.assert_close(weight.norm(dim=1), torch.full((weight.shape[0],), 2**0.5))
    torch.testing.assert_close(out_weight.norm(dim=1), torch.ones(G))


def test_decoder_gain_through_train_save_and_load(tmp_path):
    import numpy as np

    import pyro_sparse
    from pyro_sparse.data.synthetic import synthetic_sparse_dgm

    X = synthetic_sparse_dgm(n=200, rho=0.0, seed=0).X
    quick = {"latent_dim": 3, "hidden_dims": (8, 8), "batch_size": 100, "max_epochs": 2, "progress": False,
             "device": "cpu"}
    fitted = pyro_sparse.train("ssl_dgm", X, seed=0, decoder_gain="fixed", **quick)
    assert fitted.model.decoder.gain == "fixed"
    fitted.save(tmp_path / "fixed.pt")
    loaded = pyro_sparse.load(tmp_path / "fixed.pt")
    assert loaded.model.decoder.gain == "fixed"
    np.testing.assert_allclose(loaded.reconstruct(X[:20]), fitted.reconstruct(X[:20]), rtol=1e-6)
    with pytest.raises(ValueError, match="decoder_gain"):
        pyro_sparse.train("ssl_dgm", X, decoder_gain="unit", **quick)
