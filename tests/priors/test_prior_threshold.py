"""The thresholded prior's threshold learned per code (``learn_prior_threshold``): options, wiring, recovery."""

import numpy as np
import pyro
import pytest
import torch

import pyro_sparse
from pyro_sparse.priors import ThresholdedLaplacePrior, ThresholdedNormalPrior

OPTIONS = dict(latent_prior="thresholded_laplace", prior_scale=1.0, threshold=1.0, learn_prior_threshold=True,
               kl="augmented", progress=False, device="cpu")


def dense_factor_data(n=1000, seed=0):
    """Two dense N(0, 1) factors, three noisy anchor features each: every code the data need is non-zero."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, 2))
    loadings = np.array([[1.0, 0], [1.5, 0], [-1.2, 0], [0, 1.0], [0, -1.4], [0, 0.8]])
    return (z @ loadings.T + 0.2 * rng.normal(size=(n, 6))).astype(np.float32)


def test_options_are_checked():
    with pytest.raises(ValueError, match="kl='base'.*learn_prior_threshold"):
        ThresholdedLaplacePrior(3, learn_prior_threshold=True, kl="base", amortized_threshold=False)
    with pytest.raises(ValueError, match="exclude each other"):
        ThresholdedNormalPrior(3, learn_prior_threshold=True, learn_threshold=True, amortized_threshold=False)
    with pytest.raises(ValueError, match="threshold_concentration >= 1"):
        ThresholdedLaplacePrior(3, learn_prior_threshold=True, threshold_concentration=0.5)
    with pytest.raises(ValueError, match="learn_prior_threshold needs a threshold"):
        ThresholdedLaplacePrior(3, threshold=None, learn_prior_threshold=True)


def test_the_threshold_is_a_global_site_under_its_gamma_prior():
    prior = ThresholdedLaplacePrior(3, threshold=0.5, prior_scale=1.0, learn_prior_threshold=True,
                                    threshold_concentration=4.0)
    (initial, support), = prior.point_estimate_sites().values()
    assert torch.equal(initial, torch.full((3,), 0.5)) and support.check(initial).all()
    x = torch.zeros(7, 4)
    value = torch.tensor([0.1, 0.5, 2.0])
    with pyro.poutine.trace() as tape, pyro.poutine.condition(data={"prior_threshold": value}):
        prior.sample_globals(x)
        with pyro.plate("data", 7):
            prior.sample(x, 1.0)
    site = tape.trace.nodes["prior_threshold"]
    expected = torch.distributions.Gamma(4.0, 4.0 / 0.5).log_prob(value).sum()
    torch.testing.assert_close(site["fn"].log_prob(value), expected)
    # The codes' prior uses the global value: exp(-λ_k / b0) of each code non-zero (Prop. 3.1).
    codes = tape.trace.nodes["z"]["fn"].base_dist
    torch.testing.assert_close(codes.gate.expand(7, 3), (-value).exp().expand(7, 3))


def test_unused_codes_keep_a_high_threshold_and_used_ones_lower_it(tmp_path):
    X = dense_factor_data()
    fitted = pyro_sparse.train("ssl_dgm", X, latent_dim=4, hidden_dims=(16,), max_epochs=150, batch_size=100,
                               seed=0, **OPTIONS)
    learned = fitted.guide.point_estimate("prior_threshold").detach().numpy()
    zeros = (fitted.transform(X) == 0).mean(0)
    weight = np.abs(fitted.W_).sum(0)
    factors, spare = np.argsort(weight)[-2:], weight < 0.1 * weight.max()
    # The two factors' codes are dense and opened their prior gate (λ_k from 1 to ~0.01); a code the decoder
    # (nearly) ignores keeps its gate shut.  Whether such a code's mode is 0 depends on which side of 1/2 its
    # gate ends, exp(-λ_k / b0) at λ_k ≈ 0.4-0.6, so it is not asserted.
    assert spare.sum() >= 1 and not spare[factors].any()
    assert np.all(zeros[factors] < 0.01) and learned[factors].max() < 0.05
    assert learned[spare].min() > 0.3
    fitted.save(tmp_path / "model.pt")
    loaded = pyro_sparse.load(tmp_path / "model.pt", device="cpu")  # where it was fitted
    np.testing.assert_array_equal(loaded.guide.point_estimate("prior_threshold").detach().numpy(), learned)
