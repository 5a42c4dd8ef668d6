"""Pyro's distribution contract, checked for every distribution we ship.

One fixture table (``FIXTURES``): each entry names a distribution class, a few
parameter sets (scalar and batched, float64) with the batch and event shapes
they must give, parameters that violate ``arg_constraints``, a value outside
the support, and an independent numpy/scipy reference of the law. The tests
below check the properties that Pyro's generic distribution tests
(``tests/distributions/test_distributions.py`` of pyro-ppl) check for Pyro's
own distributions: shape inference (``infer_shapes`` too), sample/rsample and
log_prob shapes, log_prob against scipy, score errors on mis-shaped values,
argument and support validation, ``expand`` (our override and Pyro's default
``ExpandedDistribution``), ``to_event``, enumerate_support, and mean,
variance and entropy against Monte Carlo; plus cdf/icdf where a closed form
exists, and ``NotImplementedError`` where one does not.

Goodness of fit handles the atom at zero of the spike-and-slab laws: the
fraction of exact zeros is compared with 1 - γ (binomial standard error), and
the non-zero draws are compared with the normalised slab CDF by a
Kolmogorov–Smirnov test of their probability integral transform. Every
statistical check uses a fixed seed, a tolerance of ``Z`` standard errors or a
KS level ``ALPHA``, and is shown to reject a slightly wrong law at the same
sample size (the ``test_check_*_has_power`` tests).
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import scipy.integrate
import scipy.special
import scipy.stats
import torch
from pyro.distributions import TorchDistribution
from pyro.distributions.util import broadcast_shape

import pyro_sparse.distributions
from pyro_sparse.distributions import (
    GroupLasso,
    SelectedSpikeAndSlab,
    SpikeAndSlab,
    SpikeSlabLasso,
    ThresholdedLaplace,
    ThresholdedNormal,
)
from pyro_sparse.distributions.likelihoods import InverseGamma

Z = 5.0  # tolerance of the Monte-Carlo checks, in standard errors
ALPHA = 1e-3  # level of the KS tests
N_GOF = 20_000
N_MOMENTS = 100_000


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def to_numpy(params):
    return {k: v.numpy() if torch.is_tensor(v) else v for k, v in params.items()}


# ------------------------------------------------------- scipy references ---
# Each reference gives, for numpy parameters and values: log_prob (the
# density w.r.t. the law's measure), spike_mass (P(z = 0) per coordinate) and
# slab_cdf (the continuous part's mass below x, per coordinate), written from
# the laws' definitions with scipy rather than from our code.


class SpikeSlabLassoRef:
    @staticmethod
    def log_prob(p, x):
        eta, l0, l1 = p["eta"], p["lambda0"], p["lambda1"]
        slab = np.log(eta) + scipy.stats.laplace.logpdf(x, 0, 1 / l1)
        spike = np.log1p(-eta) + scipy.stats.laplace.logpdf(x, 0, 1 / l0)
        return np.logaddexp(slab, spike)

    @staticmethod
    def spike_mass(p):
        return np.zeros(np.broadcast_shapes(*(np.shape(v) for v in p.values())))

    @staticmethod
    def slab_cdf(p, x):
        eta, l0, l1 = p["eta"], p["lambda0"], p["lambda1"]
        return eta * scipy.stats.laplace.cdf(x, 0, 1 / l1) + (1 - eta) * scipy.stats.laplace.cdf(x, 0, 1 / l0)


class SpikeAndSlabRef:
    @staticmethod
    def gate(p):
        return p["gate"] if "gate" in p else scipy.special.expit(p["gate_logits"])

    @classmethod
    def log_prob(cls, p, x):
        gate = cls.gate(p)
        with np.errstate(divide="ignore"):
            slab = np.log(gate) + scipy.stats.norm.logpdf(x, p["loc"], p["scale"])
        return np.where(x == 0, np.log1p(-gate), slab)

    @classmethod
    def spike_mass(cls, p):
        return np.broadcast_to(1 - cls.gate(p), np.broadcast_shapes(*(np.shape(v) for v in p.values())))

    @classmethod
    def slab_cdf(cls, p, x):
        return cls.gate(p) * scipy.stats.norm.cdf(x, p["loc"], p["scale"])


class ThresholdedRef:
    """A base draw s through the soft threshold: z = s - sign(s - μ) λ off the band μ ± λ, else 0."""

    def __init__(self, base):
        self.base = base

    def spike_mass(self, p):
        loc, scale, lam = p["loc"], p["scale"], p["threshold"]
        return self.base.cdf(loc + lam, loc, scale) - self.base.cdf(loc - lam, loc, scale)

    def log_prob(self, p, x):
        # Unit Jacobian on each tail: the base density at the pre-image.
        loc, scale, lam = p["loc"], p["scale"], p["threshold"]
        slab = self.base.logpdf(x + np.sign(x - loc) * lam, loc, scale)
        return np.where(x == 0, np.log(self.spike_mass(p)), slab)

    def slab_cdf(self, p, x):
        # Below μ: {z' ≤ x} = {s ≤ x - λ}. Above: the whole left tail plus s in (μ + λ, x + λ].
        loc, scale, lam = p["loc"], p["scale"], p["threshold"]
        cdf = self.base.cdf
        above = cdf(loc - lam, loc, scale) + cdf(x + lam, loc, scale) - cdf(loc + lam, loc, scale)
        return np.where(x < loc, cdf(x - lam, loc, scale), above)


class GroupLassoRef:
    """The radius ‖w‖ is Gamma(d, λ), the direction uniform on the sphere (area 2π^{d/2} r^{d-1} / Γ(d/2))."""

    @staticmethod
    def log_prob(p, x):
        d, rate = p["dim"], p["rate"]
        r = np.linalg.norm(x, axis=-1)
        log_area = math.log(2) + d / 2 * math.log(math.pi) - scipy.special.gammaln(d / 2) + (d - 1) * np.log(r)
        return scipy.stats.gamma.logpdf(r, d, scale=1 / rate) - log_area


class SelectedSpikeAndSlabRef:
    """A mixture over p of products over k of spike-and-slabs, with weights normalised to sum to one."""

    @staticmethod
    def _parts(p):
        comp = p["components"]
        weights = p["weights"] / p["weights"].sum(-1, keepdims=True)
        return weights[..., :, None], comp.gate.numpy(), comp.loc.numpy(), comp.scale.numpy()

    @classmethod
    def log_prob(cls, p, x):
        pi, gate, loc, scale = cls._parts(p)
        x = x[..., None, :]
        per_coord = np.where(x == 0, np.log1p(-gate), np.log(gate) + scipy.stats.norm.logpdf(x, loc, scale))
        with np.errstate(divide="ignore"):  # a weight of 0 drops its component
            log_pi = np.log(pi[..., 0])
        return scipy.special.logsumexp(per_coord.sum(-1) + log_pi, axis=-1)

    @classmethod
    def spike_mass(cls, p):
        pi, gate, _, _ = cls._parts(p)
        return (pi * (1 - gate)).sum(-2)

    @classmethod
    def slab_cdf(cls, p, x):
        pi, gate, loc, scale = cls._parts(p)
        return (pi * gate * scipy.stats.norm.cdf(x[..., None, :], loc, scale)).sum(-2)


class InverseGammaRef:
    @staticmethod
    def log_prob(p, x):
        return scipy.stats.invgamma.logpdf(x, p["concentration"], scale=p["rate"])

    @staticmethod
    def spike_mass(p):
        return np.zeros(np.broadcast_shapes(*(np.shape(v) for v in p.values())))

    @staticmethod
    def slab_cdf(p, x):
        return scipy.stats.invgamma.cdf(x, p["concentration"], scale=p["rate"])

    @staticmethod
    def entropy(p):
        return scipy.stats.invgamma.entropy(p["concentration"], scale=p["rate"])


# ---------------------------------------------------------- fixture table ---
@dataclass
class Fixture:
    cls: type
    examples: list  # (kwargs, batch_shape, event_shape)
    invalid: list  # kwargs that violate arg_constraints
    reference: object
    has_atom: bool = False  # an atom at 0: spike-and-slab type
    has_cdf: bool = False
    has_icdf: bool = False
    has_entropy: bool = False
    infer_shapes: bool = True  # shapes follow from tensor shapes alone
    outside_support: float = float("nan")

    def __repr__(self):
        return self.cls.__name__

    def make(self, idx, validate_args=None):
        return self.cls(**self.examples[idx][0], validate_args=validate_args)

    def numpy_params(self, idx):
        return to_numpy(self.examples[idx][0])


def _components(gate, loc, scale):
    return SpikeAndSlab(f64(gate), f64(loc), f64(scale))


THRESHOLDED_EXAMPLES = [
    ({"loc": f64(0.5), "scale": f64(1.0), "threshold": f64(0.4)}, (), ()),
    ({"loc": f64([0.0, 1.5, -2.0]), "scale": f64([1.0, 0.5, 3.0]), "threshold": f64(0.3)}, (3,), ()),
    ({"loc": f64([[0.2], [-0.7]]), "scale": f64([0.5, 2.0]), "threshold": f64([[0.1], [1.0]])}, (2, 2), ()),
]
THRESHOLDED_INVALID = [
    {"loc": f64(0.0), "scale": f64(1.0), "threshold": f64(0.0)},
    {"loc": f64(0.0), "scale": f64(1.0), "threshold": f64(-0.1)},
    {"loc": f64(0.0), "scale": f64(0.0), "threshold": f64(0.5)},
    {"loc": f64(float("nan")), "scale": f64(1.0), "threshold": f64(0.5)},
]

FIXTURES = [
    Fixture(
        SpikeSlabLasso,
        examples=[
            ({"eta": f64(0.3), "lambda0": f64(20.0), "lambda1": f64(1.0)}, (), ()),
            ({"eta": f64([0.1, 0.5, 0.9]), "lambda0": f64(10.0), "lambda1": f64([1.0, 0.5, 2.0])}, (3,), ()),
            ({"eta": f64([[0.2], [0.7]]), "lambda0": f64([15.0, 40.0]), "lambda1": f64(1.0)}, (2, 2), ()),
        ],
        invalid=[
            {"eta": f64(1.5), "lambda0": f64(10.0), "lambda1": f64(1.0)},
            {"eta": f64(-0.1), "lambda0": f64(10.0), "lambda1": f64(1.0)},
            {"eta": f64(0.5), "lambda0": f64(0.0), "lambda1": f64(1.0)},
            {"eta": f64(0.5), "lambda0": f64(10.0), "lambda1": f64(-1.0)},
            {"eta": f64(0.5), "lambda0": f64(10.0), "lambda1": f64(0.0)},
            {"eta": f64(float("nan")), "lambda0": f64(10.0), "lambda1": f64(1.0)},
        ],
        reference=SpikeSlabLassoRef,
        has_cdf=True,
    ),
    Fixture(
        SpikeAndSlab,
        examples=[
            ({"gate": f64(0.3), "loc": f64(0.5), "scale": f64(1.0)}, (), ()),
            ({"gate": f64([0.1, 0.6, 0.95]), "loc": f64([-1.0, 0.0, 2.0]), "scale": f64(0.7)}, (3,), ()),
            ({"gate_logits": f64([[-1.0], [2.0]]), "loc": f64([0.3, -0.5]), "scale": f64([[1.5], [0.4]])}, (2, 2), ()),
        ],
        invalid=[
            {"gate": f64(1.5)},
            {"gate": f64(-0.1)},
            {"gate": f64(float("nan"))},
            {"gate": f64(0.5), "scale": f64(0.0)},
            {"gate": f64(0.5), "scale": f64([1.0, -1.0])},
            {"gate_logits": f64(float("nan"))},
        ],
        reference=SpikeAndSlabRef,
        has_atom=True,
        has_cdf=True,
        has_icdf=True,
        has_entropy=True,
    ),
    Fixture(
        ThresholdedLaplace,
        examples=THRESHOLDED_EXAMPLES,
        invalid=THRESHOLDED_INVALID,
        reference=ThresholdedRef(scipy.stats.laplace),
        has_atom=True,
        has_cdf=True,
        has_icdf=True,
        has_entropy=True,
    ),
    Fixture(
        ThresholdedNormal,
        examples=THRESHOLDED_EXAMPLES,
        invalid=THRESHOLDED_INVALID,
        reference=ThresholdedRef(scipy.stats.norm),
        has_atom=True,
        has_cdf=True,
        has_icdf=True,
        has_entropy=True,
    ),
    Fixture(
        GroupLasso,
        examples=[
            ({"rate": f64(1.5), "dim": 3}, (), (3,)),
            ({"rate": f64([0.5, 2.0]), "dim": 2}, (2,), (2,)),
            ({"rate": f64([[1.0], [3.0]]), "dim": 1}, (2, 1), (1,)),
        ],
        invalid=[{"rate": f64(0.0), "dim": 2}, {"rate": f64([1.0, -1.0]), "dim": 2}],
        reference=GroupLassoRef,
        has_entropy=True,
        infer_shapes=False,  # the event shape is the integer ``dim``, not a tensor shape
    ),
    Fixture(
        SelectedSpikeAndSlab,
        examples=[
            (
                {
                    "weights": f64([1.0, 3.0]),
                    "components": _components(
                        gate=[[0.3, 0.8, 0.5], [0.9, 0.2, 0.6]], loc=[[1.0, -1.0, 0.0], [-2.0, 0.5, 1.0]], scale=0.6
                    ),
                },
                (),
                (3,),
            ),
            (
                {
                    # Rows with zero weights: those components drop out.
                    "weights": f64([[1.0, 1.0, 2.0], [0.2, 3.0, 0.0], [1.0, 0.0, 0.0]]),
                    "components": _components(
                        gate=[[0.4, 0.7], [0.95, 0.3], [0.6, 0.5]],
                        loc=[[0.0, 2.0], [-1.5, 0.5], [1.0, -0.5]],
                        scale=[[1.0, 0.5], [0.4, 1.2], [0.8, 0.8]],
                    ),
                },
                (3,),
                (2,),
            ),
        ],
        invalid=[{"weights": f64([1.0, -0.5]), "components": _components([[0.5], [0.5]], [[0.0], [0.0]], 1.0)}],
        reference=SelectedSpikeAndSlabRef,
        has_atom=True,
        infer_shapes=False,  # the event shape comes from ``components``, not a tensor argument
    ),
    Fixture(
        InverseGamma,
        examples=[
            ({"concentration": f64(6.0), "rate": f64(2.0)}, (), ()),
            ({"concentration": f64([5.0, 6.0, 8.0]), "rate": f64([[1.0], [0.5]])}, (2, 3), ()),
        ],
        invalid=[
            {"concentration": f64(0.0), "rate": f64(1.0)},
            {"concentration": f64(2.0), "rate": f64(-1.0)},
        ],
        reference=InverseGammaRef,
        has_cdf=True,
        has_entropy=True,
        outside_support=-1.0,
    ),
]

UNIVARIATE = [f for f in FIXTURES if f.examples[0][2] == ()]
BY_CLASS = {f.cls: f for f in FIXTURES}
CASES = [pytest.param(f, i, id=f"{f!r}-{i}") for f in FIXTURES for i in range(len(f.examples))]
BATCHED_CASES = [
    pytest.param(f, i, id=f"{f!r}-{i}") for f in FIXTURES for i, ex in enumerate(f.examples) if ex[1] + ex[2] != ()
]


def test_every_distribution_is_in_the_table():
    ours = pyro_sparse.distributions
    assert {getattr(ours, name) for name in ours.__all__} <= set(BY_CLASS)


# --------------------------------------------------- statistical checks ---
def check_frequency(events, p):
    """Per coordinate, the frequency of the boolean ``events`` is within Z binomial standard errors of p."""
    n = events.shape[0]
    frac = events.double().mean(0).numpy()
    p = np.broadcast_to(p, frac.shape)
    assert np.all(np.abs(frac - p) <= Z * np.sqrt(p * (1 - p) / n)), (frac, p)


def check_zero_fraction(samples, spike_mass):
    """The fraction of exact zeros against P(z = 0), per coordinate."""
    check_frequency(samples == 0, spike_mass)


def check_slab_ks(samples, slab_cdf, spike_mass):
    """Per coordinate, the non-zero draws' slab CDF, normalised by P(z ≠ 0), is uniform (KS)."""
    u = (slab_cdf / (1 - spike_mass)).reshape(samples.shape[0], -1)
    nonzero = (samples != 0).reshape(samples.shape[0], -1).numpy()
    for j in range(u.shape[1]):
        result = scipy.stats.kstest(u[nonzero[:, j], j], "uniform")
        assert result.pvalue > ALPHA, (j, result)


def check_moments(samples, mean, variance):
    """Sample mean and variance within Z standard errors (Var of s² ≈ (μ₄ - σ⁴)/n, μ₄ estimated)."""
    n = samples.shape[0]
    sample_mean, sample_var = samples.mean(0), samples.var(0)
    m4 = ((samples - sample_mean) ** 4).mean(0)
    assert torch.all((sample_mean - mean).abs() <= Z * (variance / n).sqrt()), (sample_mean, mean)
    assert torch.all((sample_var - variance).abs() <= Z * ((m4 - sample_var**2) / n).sqrt()), (sample_var, variance)


def check_entropy(neg_log_prob, entropy):
    """-E[log p] within Z standard errors of the entropy (log p w.r.t. the law's own measure)."""
    n = neg_log_prob.shape[0]
    se = neg_log_prob.std(0) / math.sqrt(n)
    assert torch.all((neg_log_prob.mean(0) - entropy).abs() <= Z * se), (neg_log_prob.mean(0), entropy)


def test_check_zero_fraction_has_power():
    torch.manual_seed(0)
    z = SpikeAndSlab(f64(0.4), 0.0, 1.0).sample((N_GOF,))
    check_zero_fraction(z, 0.6)
    with pytest.raises(AssertionError):
        check_zero_fraction(z, 0.63)


def test_check_slab_ks_has_power():
    # Thresholded-normal draws judged against a slab shifted by 5% of its scale: rejected.
    torch.manual_seed(1)
    ref = ThresholdedRef(scipy.stats.norm)
    p = {"loc": np.array(0.5), "scale": np.array(1.0), "threshold": np.array(0.4)}
    z = ThresholdedNormal(f64(0.5), f64(1.0), f64(0.4)).sample((N_GOF,))
    x = z.numpy()
    check_slab_ks(z, ref.slab_cdf(p, x), ref.spike_mass(p))
    wrong = dict(p, loc=np.array(0.55))
    with pytest.raises(AssertionError):
        check_slab_ks(z, ref.slab_cdf(wrong, x), ref.spike_mass(wrong))


def test_check_moments_and_entropy_have_power():
    torch.manual_seed(2)
    d = ThresholdedLaplace(f64(1.0), f64(1.0), f64(0.5))
    z = d.sample((N_MOMENTS,))
    check_moments(z, d.mean, d.variance)
    with pytest.raises(AssertionError):
        check_moments(z, d.mean + 0.02, d.variance)
    with pytest.raises(AssertionError):
        check_moments(z, d.mean, d.variance * 1.03)
    neg_log_prob = -d.log_prob(z)
    check_entropy(neg_log_prob, d.entropy())
    with pytest.raises(AssertionError):
        check_entropy(neg_log_prob, d.entropy() + 0.02)


# ----------------------------------------------------------------- shapes ---
@pytest.mark.parametrize("fix,idx", CASES)
def test_shapes(fix, idx):
    _, batch_shape, event_shape = fix.examples[idx]
    d = fix.make(idx)
    assert d.batch_shape == batch_shape and d.event_shape == event_shape
    assert d.support.event_dim == d.event_dim == len(event_shape)
    assert not d.support.is_discrete


@pytest.mark.parametrize("fix,idx", CASES)
def test_infer_shapes(fix, idx):
    kwargs, batch_shape, event_shape = fix.examples[idx]
    arg_shapes = {k: v.shape if torch.is_tensor(v) else () for k, v in kwargs.items()}
    if not fix.infer_shapes:
        # As for Pyro's LKJ: the shapes cannot be computed from argument shapes.
        with pytest.raises(NotImplementedError):
            fix.cls.infer_shapes(**arg_shapes)
        return
    assert fix.cls.infer_shapes(**arg_shapes) == (batch_shape, event_shape)


@pytest.mark.parametrize("sample_shape", [(), (4,), (2, 3)])
@pytest.mark.parametrize("fix,idx", CASES)
def test_sample_and_rsample_shapes(fix, idx, sample_shape):
    d = fix.make(idx)
    expected = torch.Size(sample_shape) + d.batch_shape + d.event_shape
    x = d.sample(sample_shape)
    assert x.shape == expected and x.dtype == torch.float64 and not x.requires_grad
    if d.has_rsample:
        assert d.rsample(sample_shape).shape == expected
    else:
        with pytest.raises(NotImplementedError):
            d.rsample(sample_shape)


@pytest.mark.parametrize("fix,idx", CASES)
def test_log_prob_shapes(fix, idx):
    d = fix.make(idx, validate_args=True)
    x = d.sample((5,))
    ones = (1,) * len(d.batch_shape)
    one_point = x.reshape((-1,) + d.event_shape)[0].reshape(ones + d.event_shape)
    # Draws, draws with an extra dimension, and a value that broadcasts
    # against the batch shape, as in Pyro's fixtures.
    for value in [x[0], x, x[:, None], one_point.expand((2,) + ones + d.event_shape)]:
        full = broadcast_shape(d.shape(), value.shape)
        assert d.log_prob(value).shape == full[: len(full) - d.event_dim]


def _test_values(fix, d, seed=0):
    """Draws, with exact zeros mixed in for laws with an atom, shape (6,) + batch + event."""
    torch.manual_seed(seed)
    x = d.sample((6,))
    if fix.has_atom:
        x[:2] = 0
    return x


@pytest.mark.parametrize("fix,idx", CASES)
def test_log_prob_matches_scipy(fix, idx):
    d = fix.make(idx)
    x = _test_values(fix, d)
    expected = fix.reference.log_prob(fix.numpy_params(idx), x.numpy())
    np.testing.assert_allclose(d.log_prob(x).numpy(), expected, rtol=1e-10, atol=1e-12)


# -------------------------------------------------------- score errors ---
@pytest.mark.parametrize("fix,idx", BATCHED_CASES)
def test_score_errors_on_mis_shaped_values(fix, idx):
    d = fix.make(idx, validate_args=True)
    shape = d.shape()
    bad = [(shape[0] + 1,) + shape[1:]]  # does not broadcast against batch + event
    if d.event_shape:
        bad.append(shape[:-1] + (shape[-1] + 1,))  # wrong event size
        if shape[-1] != 1:
            bad.append(shape + (1,))  # Pyro's event-dim mismatch: event (1,) against (K,)
    for value_shape in bad:
        with pytest.raises(ValueError):
            d.log_prob(torch.ones(value_shape, dtype=torch.float64))
        if fix.has_cdf:
            with pytest.raises(ValueError):
                d.cdf(torch.ones(value_shape, dtype=torch.float64))


def test_selected_spike_and_slab_rejects_a_value_with_one_coordinate():
    # The violation this contract found: a (3, 3, 1) value for batch (3,),
    # event (3,) was broadcast across the K coordinates and scored.
    components = SpikeAndSlab(torch.full((3, 3), 0.5), torch.zeros(3, 3), torch.ones(3, 3))
    d = SelectedSpikeAndSlab(torch.ones(3, 3), components, validate_args=True)
    assert d.batch_shape == (3,) and d.event_shape == (3,)
    with pytest.raises(ValueError, match="event_shape"):
        d.log_prob(torch.ones(3, 3, 1))
    assert d.log_prob(torch.ones(3, 3)).shape == (3,)


# -------------------------------------------------------------- validation ---
@pytest.mark.parametrize("fix", FIXTURES, ids=repr)
def test_invalid_arguments_raise_only_with_validation(fix):
    for kwargs in fix.invalid:
        with pytest.raises(ValueError):
            fix.cls(**kwargs, validate_args=True)
        fix.cls(**kwargs, validate_args=False)
        with pyro.validation_enabled(True), pytest.raises(ValueError):
            fix.cls(**kwargs)
        with pyro.validation_enabled(False):
            fix.cls(**kwargs)
    for idx in range(len(fix.examples)):
        fix.make(idx, validate_args=True)  # the valid examples pass


@pytest.mark.parametrize("fix,idx", CASES)
def test_support(fix, idx):
    d = fix.make(idx, validate_args=True)
    x = _test_values(fix, d)
    ok = d.support.check(x)
    assert ok.shape == broadcast_shape(d.batch_shape, x.shape[: x.dim() - d.event_dim]) and ok.all()
    d.log_prob(x)
    outside = x.clone()
    outside.view(-1)[-1] = fix.outside_support
    assert not d.support.check(outside).all()
    with pytest.raises(ValueError, match="support"):
        d.log_prob(outside)
    if fix.has_cdf:
        with pytest.raises(ValueError, match="support"):
            d.cdf(outside)


@pytest.mark.parametrize("fix,idx", CASES)
def test_no_enumerate_support(fix, idx):
    d = fix.make(idx)
    assert not d.has_enumerate_support
    with pytest.raises(NotImplementedError):
        d.enumerate_support()


# ------------------------------------------------------------------ expand ---
def check_sample_shapes(small, large):
    """log_prob of the small and the expanded law agree on draws of either."""
    x = small.sample()
    torch.testing.assert_close(small.log_prob(x).expand(large.batch_shape), large.log_prob(x))
    x = large.sample()
    torch.testing.assert_close(small.log_prob(x), large.log_prob(x))


@pytest.mark.parametrize("default", [False, True], ids=["own", "ExpandedDistribution"])
@pytest.mark.parametrize("fix,idx", CASES)
def test_expand(fix, idx, default):
    for validate_args in [True, False]:
        small = fix.make(idx, validate_args=validate_args)
        expand = TorchDistribution.expand if default else type(small).expand
        for new in [(2,), (2, 3)]:
            for shape_type in [torch.Size, tuple, list]:
                large = expand(small, shape_type(new + tuple(small.batch_shape)))
                assert large.batch_shape == new + small.batch_shape
                assert large.event_shape == small.event_shape
                if not default:  # Pyro's ExpandedDistribution is not ours to check
                    assert type(large) is type(small)
                    assert large._validate_args is validate_args
                    assert small.expand_by(shape_type(new)).batch_shape == large.batch_shape
                check_sample_shapes(small, large)
                torch.testing.assert_close(large.mean, small.mean.expand(large.shape()))
                torch.testing.assert_close(large.variance, small.variance.expand(large.shape()))
        # Growing a dimension of size 1, then an impossible expansion.
        ones = expand(small, (2, 1) + tuple(small.batch_shape))
        grown = ones.expand((2, 5) + small.batch_shape)
        check_sample_shapes(small, grown)
        with pytest.raises((RuntimeError, ValueError)):
            ones.expand((4, 3) + small.batch_shape)
        with pytest.raises((RuntimeError, ValueError)):
            grown.expand((5,) + small.batch_shape)
        if validate_args and small.batch_shape:
            with pytest.raises(ValueError):
                grown.log_prob(torch.ones((3,) + small.shape(), dtype=torch.float64))


@pytest.mark.parametrize("fix,idx", CASES)
def test_to_event(fix, idx):
    d = fix.make(idx)
    base = d if d.batch_shape else d.expand((2,))
    ind = base.to_event(1)
    assert isinstance(ind, dist.Independent)
    assert ind.batch_shape == base.batch_shape[:-1]
    assert ind.event_shape == base.batch_shape[-1:] + base.event_shape
    x = ind.sample((3,))
    assert x.shape == (3,) + ind.shape()
    torch.testing.assert_close(ind.log_prob(x), base.log_prob(x).sum(-1))


# --------------------------------------------------------------- moments ---
@pytest.mark.parametrize("fix,idx", CASES)
def test_mean_and_variance_match_monte_carlo(fix, idx):
    d = fix.make(idx)
    assert d.mean.shape == d.variance.shape == d.shape()
    torch.manual_seed(3)
    check_moments(d.sample((N_MOMENTS,)), d.mean, d.variance)


@pytest.mark.parametrize("fix,idx", CASES)
def test_entropy(fix, idx):
    d = fix.make(idx)
    if not fix.has_entropy:
        with pytest.raises(NotImplementedError):
            d.entropy()
        return
    entropy = d.entropy()
    assert entropy.shape == d.batch_shape
    torch.manual_seed(4)
    check_entropy(-d.log_prob(d.sample((N_MOMENTS,))), entropy)


def _quad_entropy(ref, params, edges):
    """-a log a - ∫ p log p over z ≠ 0 of a univariate law (a = P(z = 0)), by quadrature of the scipy density."""

    def integrand(x):
        log_p = float(ref.log_prob(params, np.float64(x)))
        return -math.exp(log_p) * log_p if log_p > -np.inf else 0.0

    integral = sum(
        scipy.integrate.quad(integrand, a, b, epsabs=1e-10)[0] for a, b in itertools.pairwise(edges)
    )
    spike = float(ref.spike_mass(params))
    return integral - scipy.special.xlogy(spike, spike)


@pytest.mark.parametrize("fix,idx", [c for c in CASES if c.values[0] in UNIVARIATE and c.values[0].has_entropy])
def test_entropy_matches_numerical_integration(fix, idx):
    # The entropy w.r.t. (counting measure at 0) + Lebesgue, element by element.
    d = fix.make(idx)
    params = fix.numpy_params(idx)
    entropy = d.entropy()
    for i in np.ndindex(*d.batch_shape):
        elem = {k: np.broadcast_to(v, d.batch_shape)[i] for k, v in params.items()}
        if fix.cls is InverseGamma:
            edges = [0.0, float(elem["rate"] / (elem["concentration"] + 1)), np.inf]  # split at the mode
        else:
            edges = [-np.inf, *sorted({0.0, float(elem["loc"])}), np.inf]  # split at the atom and the cusp
        assert entropy[i].item() == pytest.approx(_quad_entropy(fix.reference, elem, edges), abs=1e-8)
    if hasattr(fix.reference, "entropy"):
        np.testing.assert_allclose(entropy.numpy(), fix.reference.entropy(params), rtol=1e-10)


# ------------------------------------------------------------- cdf / icdf ---
@pytest.mark.parametrize("fix,idx", CASES)
def test_cdf(fix, idx):
    d = fix.make(idx)
    if not fix.has_cdf:
        with pytest.raises(NotImplementedError):
            d.cdf(d.sample())
        return
    params = fix.numpy_params(idx)
    x = _test_values(fix, d)
    if fix.has_atom:
        x[2] = -1e-300  # just below the atom
    expected = fix.reference.slab_cdf(params, x.numpy()) + np.where(x.numpy() >= 0, fix.reference.spike_mass(params), 0)
    actual = d.cdf(x)
    assert actual.shape == x.shape
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-10, atol=1e-14)
    torch.manual_seed(9)
    values = d.cdf(d.sample((2000,)).sort(0).values)
    assert torch.all(values[1:] >= values[:-1]) and torch.all((values >= 0) & (values <= 1))


@pytest.mark.parametrize("fix,idx", CASES)
def test_icdf(fix, idx):
    d = fix.make(idx)
    torch.manual_seed(5)
    u = torch.rand((500,) + d.shape(), dtype=torch.float64)
    if not fix.has_icdf:
        with pytest.raises(NotImplementedError):
            d.icdf(u)
        return
    x = d.icdf(u)
    assert x.shape == u.shape
    params = fix.numpy_params(idx)
    # The generalised inverse: exactly 0 where u falls on the jump of the atom,
    # cdf(icdf(u)) = u elsewhere.
    below = fix.reference.slab_cdf(params, np.zeros(d.shape()))
    on_jump = torch.from_numpy((u.numpy() > below) & (u.numpy() <= below + fix.reference.spike_mass(params)))
    assert on_jump.any() and (~on_jump).any()
    assert torch.equal(x == 0, on_jump)
    torch.testing.assert_close(d.cdf(x)[~on_jump], u[~on_jump], rtol=1e-9, atol=1e-12)
    # icdf of a uniform draw is a draw of the law: same zero fraction.
    check_zero_fraction(x, fix.reference.spike_mass(params))
    # The ends of the support, also where S(0) + a rounds to 1 (float32, slab mass above 0 below its epsilon).
    ends = torch.tensor([0.0, 1.0], dtype=torch.float64).reshape((2,) + (1,) * len(d.shape())).expand((2,) + d.shape())
    assert torch.equal(d.icdf(ends), torch.stack([torch.full(d.shape(), -math.inf, dtype=torch.float64),
                                                  torch.full(d.shape(), math.inf, dtype=torch.float64)]))


# -------------------------------------------------------- goodness of fit ---
@pytest.mark.parametrize("fix,idx", [c for c in CASES if c.values[0].cls is not GroupLasso])
def test_goodness_of_fit(fix, idx):
    # Atom and slab separately: the zero fraction against P(z = 0), the
    # non-zero draws against the normalised slab CDF (for continuous laws the
    # first is "no exact zeros" and the second a plain KS test).
    d = fix.make(idx)
    params = fix.numpy_params(idx)
    torch.manual_seed(6)
    z = d.sample((N_GOF,))
    spike = fix.reference.spike_mass(params)
    check_zero_fraction(z, spike)
    check_slab_ks(z, fix.reference.slab_cdf(params, z.numpy()), spike)


def test_selected_spike_and_slab_draws_one_component_per_point():
    # Coordinates share the component choice: P(z₁ = z₂ = 0) = Σ_p π_p (1 - γ_p1)(1 - γ_p2),
    # which here differs from the product of the marginal zero probabilities.
    fix = BY_CLASS[SelectedSpikeAndSlab]
    params = fix.numpy_params(0)
    pi, gate, _, _ = SelectedSpikeAndSlabRef._parts(params)
    joint = float((pi[:, 0] * (1 - gate[:, 0]) * (1 - gate[:, 1])).sum())
    marginal = SelectedSpikeAndSlabRef.spike_mass(params)
    assert abs(joint - marginal[0] * marginal[1]) > 0.05
    torch.manual_seed(7)
    z = fix.make(0).sample((N_GOF,))
    check_frequency((z[:, 0] == 0) & (z[:, 1] == 0), joint)


@pytest.mark.parametrize("idx", range(3))
def test_group_lasso_radius_and_direction(idx):
    # ‖w‖ ~ Gamma(d, λ) and, on the sphere, (u₁ + 1)/2 ~ Beta((d-1)/2, (d-1)/2)
    # (for d = 1 the sign is a fair coin).
    d = BY_CLASS[GroupLasso].make(idx)
    dim = d.event_shape[0]
    torch.manual_seed(8)
    w = d.sample((N_GOF,)).reshape(N_GOF, -1, dim)
    rate = d.rate.reshape(-1).numpy()
    radius = w.norm(dim=-1)
    first = (w[..., 0] / radius).numpy()
    for j, lam in enumerate(rate):
        assert scipy.stats.kstest(radius[:, j].numpy(), scipy.stats.gamma(dim, scale=1 / lam).cdf).pvalue > ALPHA
        if dim == 1:
            check_frequency(torch.from_numpy(first[:, j] > 0), 0.5)
        else:
            beta = scipy.stats.beta((dim - 1) / 2, (dim - 1) / 2)
            assert scipy.stats.kstest((first[:, j] + 1) / 2, beta.cdf).pvalue > ALPHA
