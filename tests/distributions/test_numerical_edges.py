"""Where the closed forms must not cancel or underflow: narrow slabs far from 0, far tails, mismatched sizes."""

import math

import pyro.distributions as pdist
import pytest
import torch
from torch.distributions import kl_divergence

from pyro_sparse.distributions import SelectedSpikeAndSlab, SpikeAndSlab, ThresholdedLaplace, ThresholdedNormal


@pytest.mark.parametrize("make, exact", [
    # A slab of sd 1e-4 around 3, nearly always on: Var = γσ² + γ(1 - γ)μ² ≈ 1e-8 (E[z²] - E[z]² gave 0).
    (lambda: SpikeAndSlab(torch.tensor(1.0), torch.tensor(3.0), torch.tensor(1e-4)), 1e-8),
    (lambda: ThresholdedLaplace(torch.tensor(3.0), torch.tensor(1e-4), torch.tensor(1e-9)),
     2 * math.exp(-1e-5) * 1e-8 + math.exp(-1e-5) * (1 - math.exp(-1e-5)) * 9.0),
    (lambda: SelectedSpikeAndSlab(torch.ones(1), SpikeAndSlab(torch.ones(1, 1), 3 * torch.ones(1, 1),
                                                              1e-4 * torch.ones(1, 1))), 1e-8),
])
def test_variances_of_narrow_slabs_far_from_zero(make, exact):
    assert float(make().variance.sum()) == pytest.approx(exact, rel=1e-3)


def test_thresholded_normal_variance_of_a_narrow_slab():
    narrow = ThresholdedNormal(torch.tensor(3.0, dtype=torch.float64), torch.tensor(1e-4, dtype=torch.float64),
                               torch.tensor(1e-6, dtype=torch.float64))
    assert float(ThresholdedNormal(torch.tensor(3.0), torch.tensor(1e-4), torch.tensor(1e-6)).variance) == pytest.approx(
        float(narrow.variance), rel=1e-3)


@pytest.mark.parametrize("z", [-20.0, -40.0, -100.0])
def test_thresholded_laplace_far_lower_tail(z):
    # Mass below z < μ: ½ exp((z - μ - λ)/b); Laplace.cdf rounded it to 0 from about z = -37 (float64).
    laplace = ThresholdedLaplace(torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64),
                                 torch.tensor(0.5, dtype=torch.float64))
    exact = 0.5 * math.exp(z - 0.5)
    assert float(laplace.cdf(torch.tensor(z, dtype=torch.float64))) == pytest.approx(exact, rel=1e-9)
    assert float(laplace.icdf(torch.tensor(exact, dtype=torch.float64))) == pytest.approx(z, rel=1e-9)
    single = ThresholdedLaplace(torch.tensor(0.0), torch.tensor(1.0), torch.tensor(0.5))
    assert float(single.cdf(torch.tensor(-20.0))) == pytest.approx(0.5 * math.exp(-20.5), rel=1e-5)
    # The upper tail mirrors it, and the spike's mass sits between.
    assert float(laplace.cdf(torch.tensor(-z, dtype=torch.float64))) == pytest.approx(1 - exact, abs=1e-15)


def test_kls_refuse_codes_of_different_sizes():
    q = pdist.MultivariateNormal(torch.zeros(4), torch.eye(4))
    with pytest.raises(ValueError, match=r"different sizes: \(4,\) and \(1,\)"):
        kl_divergence(q, pdist.Normal(torch.zeros(1), 1.0).to_event(1))
    spike = SpikeAndSlab(torch.full((1,), 0.5), torch.zeros(1), torch.ones(1)).to_event(1)
    components = SpikeAndSlab(torch.full((2, 4), 0.5), torch.zeros(2, 4), torch.ones(2, 4))
    prior = SelectedSpikeAndSlab(torch.ones(2), components, kl_objective="selection_weighted")
    with pytest.raises(ValueError, match=r"different sizes: \(1,\) and \(4,\)"):
        kl_divergence(spike, prior)
    # torch's own classes dispatch to the same closed form as Pyro's.
    torch_q = torch.distributions.MultivariateNormal(torch.zeros(4), torch.eye(4) * 2)
    torch_p = torch.distributions.Independent(torch.distributions.Normal(torch.ones(4), 1.0), 1)
    assert float(kl_divergence(torch_q, torch_p)) == pytest.approx(0.5 * (4 * 2 + 4 - 4 - 4 * math.log(2)), rel=1e-6)


def test_selection_weights_must_select_something():
    components = SpikeAndSlab(torch.full((3, 2), 0.5), torch.zeros(3, 2), torch.ones(3, 2))
    with pytest.raises(ValueError, match="all 0: they select no component"):
        SelectedSpikeAndSlab(torch.zeros(3), components, validate_args=True)


def test_icdf_at_one_is_the_top_of_the_support_where_the_atom_rounds_up_to_it():
    # float32: slab mass above 0 below epsilon, so S(0) + a rounds to 1 and u = 1 fell on the atom (0).
    assert float(SpikeAndSlab(torch.tensor(0.3828), torch.tensor(-2.4124), torch.tensor(0.4599)).icdf(
        torch.tensor(1.0))) == math.inf
    double = dict(dtype=torch.float64)
    assert float(ThresholdedNormal(torch.tensor(-1.0, **double), torch.tensor(0.1, **double),
                                   torch.tensor(0.5, **double)).icdf(torch.tensor(1.0, **double))) == math.inf
    # Without a slab (gamma = 0) the law is the atom: u = 1 is 0, not the top of a slab.
    atom = SpikeAndSlab(torch.zeros(2), torch.zeros(2), torch.ones(2))
    assert atom.icdf(torch.tensor([0.5, 1.0])).tolist() == [0.0, 0.0]
