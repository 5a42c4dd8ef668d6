"""
Priors of the per-data-point code z, as modules a model samples its codes from.

A model calls ``z = latent_prior.sample(x, kl_weight)`` inside its data
plate; what it gets back is a (batch, K) code, whatever the prior.  Each
prior states the guide family it pairs with (``guide_family``: ``"normal"``,
``"spike_slab"`` or ``"thresholded"``; :mod:`pyro_sparse.registry` maps the
family to a guide class) and what that guide must share with it
(``guide_options``).  The KL term between guide and prior is whatever
``torch.distributions.kl`` has registered for the pair, else a Monte-Carlo
estimate (Pyro's mean-field ELBO falls back to log p(z) - log q(z) by
itself; ``train`` logs which one each site uses).

Registered names (``train(..., latent_prior="spike_slab", alpha=0.1)``; the
keyword arguments of each class below are the prior's hyperparameters):

* ``"normal"``: :class:`NormalPrior`, N(0, Σ);
* ``"spike_slab"``: :class:`SpikeSlabPrior`, VSC's α N(0, 1) + (1 - α) δ_0;
* ``"pseudo_inputs"``: :class:`PseudoInputPrior`, VSC's learned prior;
* ``"thresholded_laplace"`` / ``"thresholded_normal"``: :class:`ThresholdedPrior`,
  Fallah & Rozell's soft-thresholded codes, optionally with a learned threshold.

Any Pyro distribution is a prior too (:class:`DistributionPrior`): pass an
instance, e.g. ``latent_prior=dist.Laplace(0.0, 1.0)``, or a factory
``f(latent_dim) -> distribution``; a factory that is an ``nn.Module`` has its
parameters learned with the model's.  Priors know nothing of the model.
"""

import math
import numbers
import warnings

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from torch import nn
from torch.distributions import Distribution, constraints

from pyro_sparse.checks import is_count, positive_number
from pyro_sparse.distributions import SelectedSpikeAndSlab, SpikeAndSlab
from pyro_sparse.distributions.thresholded import code_distribution
from pyro_sparse.distributions.util import is_real_support, on_device, unshared
from pyro_sparse.priors.site import own_copy


class LatentPrior(nn.Module):
    """
    The prior of a data point's code z, event shape (K,).  Subclasses give
    :meth:`distribution`; priors with more local latents than z (a learned
    threshold) or extra terms (a factor) override :meth:`sample`.
    """

    guide_family = "normal"
    # Whether codes are sparse, so that more dimensions than features are
    # meaningful (train() warns about latent_dim > G only for dense codes).
    sparse_codes = True
    # Whether the prior runs the guide's encoder on inputs of its own
    # (pseudo-inputs), which a batch-normalised encoder would treat as a batch.
    encodes_inputs = False

    def __init__(self, latent_dim):
        super().__init__()
        self.latent_dim = latent_dim

    def distribution(self, x):
        """p(z) for the data points of ``x``: event shape (K,), batch broadcastable to ``x.shape[:-1]``."""
        raise NotImplementedError

    def guide_options(self):
        """What a guide of this prior's family must share with it."""
        return {}

    def attach_guide(self, guide):
        """Called once the guide is built; for priors that use the guide's networks."""

    def point_estimate_sites(self):
        """Global sites of this prior that the guide point-estimates: name -> (initial value, support)."""
        return {}

    def sample_globals(self, like):
        """The prior's global sites, sampled by the model before its data plate (none by default)."""

    def sample(self, x, kl_weight):
        """The code sites of one minibatch (inside the model's data plate); returns z."""
        with poutine.scale(scale=kl_weight):
            return pyro.sample("z", self.distribution(x))


class NormalPrior(LatentPrior):
    r"""
    z ~ N(0, Σ_z) (Moran et al. 2022, Eq. 1 and 59): Σ_z = I_K by default, a
    fixed (K, K) positive definite ``prior_covariance``, or, with
    ``learn_correlation``, a correlation matrix R = L Lᵀ learned with the
    model.  R has a unit diagonal, so the scale of the codes stays fixed and
    the decoder (and the sparse mask W) carries the scale of the data; only
    the factors' correlations are learned.

    A learned R is a global site ``"latent_correlation"`` holding its Cholesky
    factor L with the prior L ~ LKJCholesky(K, η) (η = ``lkj_concentration``;
    η = 1 is uniform over correlation matrices, η > 1 favours independence),
    point-estimated (MAP) like W and σ²: it is shared by all N data points,
    so its posterior is concentrated and a point estimate loses little, and
    the KL of Eq. 59 between the diagonal Gaussian q(z | x) and N(0, R) stays
    in closed form.  With Σ_z = I the KL charges ½ log(1/(1 - ρ²)) nats per
    data point for factors correlated by ρ, which pushes the fit towards
    decorrelated (rotated) factors; a learned R removes that charge.

    :param int latent_dim: K.
    :param prior_covariance: a fixed Σ_z, or ``None``.
    :param bool learn_correlation: learn R (exclusive with ``prior_covariance``).
    :param float lkj_concentration: η > 0 of the LKJ prior of a learned R.
    :param initial_correlation: where a learned R starts, a (K, K)
        correlation matrix (default I), e.g. a pilot fit's
        ``latent_correlation_``.
    """

    sparse_codes = False
    site = "latent_correlation"

    option_conditions = {"lkj_concentration": ("learn_correlation", (True,))}

    def __init__(self, latent_dim, prior_covariance=None, learn_correlation=False, lkj_concentration=2.0,
                 initial_correlation=None):
        super().__init__(latent_dim)
        lkj_concentration = positive_number("lkj_concentration", lkj_concentration)
        if learn_correlation and prior_covariance is not None:
            raise ValueError("learn_correlation and prior_covariance exclude each other: give one of them")
        if initial_correlation is not None and not learn_correlation:
            raise ValueError("initial_correlation is the start of a learned correlation: pass learn_correlation=True")
        if learn_correlation and latent_dim == 1:
            warnings.warn("learn_correlation with latent_dim=1: a single code has no correlation to learn",
                          stacklevel=2)
        self.learn_correlation = bool(learn_correlation) and latent_dim > 1
        self.lkj_concentration = lkj_concentration
        self.identity_covariance = prior_covariance is None and not self.learn_correlation
        self.register_buffer("scale_tril", _cholesky(prior_covariance, latent_dim))
        self.initial_scale_tril = _cholesky(initial_correlation, latent_dim, "initial_correlation")
        if not torch.allclose(self.initial_scale_tril.square().sum(1), torch.ones(latent_dim), atol=1e-4):
            raise ValueError("initial_correlation must be a correlation matrix: its diagonal must be 1")
        self._sampled_scale_tril = None

    def point_estimate_sites(self):
        if not self.learn_correlation:
            return {}
        return {self.site: (self.initial_scale_tril, constraints.corr_cholesky)}

    def sample_globals(self, like):
        if self.learn_correlation:
            prior = dist.LKJCholesky(self.latent_dim, like.new_tensor(self.lkj_concentration))
            self._sampled_scale_tril = pyro.sample(self.site, prior)

    def distribution(self, x):
        if self.identity_covariance:
            return dist.Normal(x.new_zeros(self.latent_dim), 1.0).to_event(1)
        scale_tril = self._sampled_scale_tril if self.learn_correlation else self.scale_tril
        if scale_tril is None:
            raise RuntimeError("a learned correlation is sampled by the model (sample_globals) before the codes")
        return dist.MultivariateNormal(x.new_zeros(self.latent_dim), scale_tril=scale_tril.to(x.dtype))


class CorrelatedNormalPrior(NormalPrior):
    """
    ``latent_prior="correlated"``: :class:`NormalPrior` with a learned
    correlation matrix under an LKJ(``lkj_concentration``) prior.
    """

    option_conditions = {}  # the correlation is always learned

    def __init__(self, latent_dim, lkj_concentration=2.0, initial_correlation=None):
        super().__init__(latent_dim, learn_correlation=True, lkj_concentration=lkj_concentration,
                         initial_correlation=initial_correlation)


def _cholesky(covariance, latent_dim, name="prior_covariance"):
    """The Cholesky factor of a covariance option ``name`` (identity for ``None``), after checking it."""
    if covariance is None:
        return torch.eye(latent_dim)
    covariance = torch.as_tensor(np.asarray(covariance, dtype=np.float32))
    if covariance.shape != (latent_dim, latent_dim):
        raise ValueError(f"{name} must be ({latent_dim}, {latent_dim}), got {tuple(covariance.shape)}")
    scale_tril, info = torch.linalg.cholesky_ex(covariance)
    if info != 0 or not torch.allclose(covariance, covariance.T, atol=1e-6):
        raise ValueError(f"{name} must be a symmetric positive definite matrix")
    return scale_tril


class SpikeSlabPrior(LatentPrior):
    r"""
    z_k ~ α N(0, s²) + (1 - α) δ_0 (Tonolini et al., ICLR version Eq. 4, where
    s = 1): α is the prior probability that a code dimension is non-zero.
    ``slab_scale`` s = √0.1 is Fallah & Rozell's (2022, Appendix D) prior
    "scale" 0.1 for their spike-and-slab baseline on patches, which their code
    uses as the slab's variance (as for their Gaussian priors).
    """

    guide_family = "spike_slab"

    def __init__(self, latent_dim, alpha=0.01, slab_scale=1.0):
        super().__init__(latent_dim)
        if not (isinstance(alpha, numbers.Real) and not isinstance(alpha, bool) and 0 < alpha < 1):
            # α = 1 is the Gaussian limit, but then the spike term (1-γ)log((1-γ)/(1-α))
            # of the KL is infinite for any posterior with γ < 1: use latent_prior="normal".
            raise ValueError(f"alpha must be a number in (0, 1), got {alpha!r}; "
                             "for alpha = 1 use latent_prior='normal'")
        self.alpha = float(alpha)
        self.slab_scale = positive_number("slab_scale", slab_scale)

    def distribution(self, x):
        return SpikeAndSlab(x.new_full((self.latent_dim,), self.alpha), 0.0, self.slab_scale).to_event(1)


class PseudoInputPrior(SpikeSlabPrior):
    r"""
    The learned spike-and-slab prior of VSC's UAI version (supplement A.3):
    ``num_pseudo_inputs`` learned inputs u_p, encoded by the guide's
    recognition network into spike-and-slab components, and a selection
    function C_ω(x) (one linear layer + ReLU, normalised to unit sum, then
    sigmoid(a(· − b)) with a = ``selection_sharpness``, b =
    ``selection_threshold``) that weighs them per data point.  The KL of the
    pseudo-inputs' mean spike probability to α is added once per data point,
    which keeps the prior's sparsity at α.  Pseudo-inputs are learned
    unconstrained in the guide's input units
    (:meth:`~pyro_sparse.guides.amortized.AmortizedGuide.inputs_from_unconstrained`:
    non-negative when the guide reads counts).
    """

    encodes_inputs = True

    def __init__(
        self, num_features, latent_dim, alpha=0.01, num_pseudo_inputs=20, selection_sharpness=60.0,
        selection_threshold=0.5,
    ):
        super().__init__(latent_dim, alpha)
        if not is_count(num_pseudo_inputs):
            raise ValueError(f"num_pseudo_inputs must be a positive integer, got {num_pseudo_inputs!r}")
        positive_number("selection_sharpness", selection_sharpness)
        if not 0 < selection_threshold < 1:
            raise ValueError(f"selection_threshold is compared with a pseudo-input's share of the scores: it must be "
                             f"in (0, 1), got {selection_threshold!r}")
        self.pseudo_inputs = nn.Parameter(torch.randn(num_pseudo_inputs, num_features))
        self.selection = nn.Sequential(nn.Linear(num_features, num_pseudo_inputs), nn.ReLU())
        self.selection_sharpness, self.selection_threshold = float(selection_sharpness), float(selection_threshold)
        self._encode = self._to_inputs = None

    def attach_guide(self, guide):
        if guide.batch_norm:
            raise ValueError("latent_prior='pseudo_inputs' encodes its pseudo-inputs with the guide's encoder; "
                             "a batch-normalised encoder would normalise them as a batch: use batch_norm=False")
        # Bound methods, not submodules: the guide owns (and saves) its networks.
        self._encode, self._to_inputs = guide.posterior, guide.inputs_from_unconstrained

    def distribution(self, x):
        if self._encode is None:
            raise RuntimeError("PseudoInputPrior needs the guide's recognition network: call attach_guide(guide)")
        # Supplement A.3: u* = sigmoid(a (u / Σu - b)), u = ReLU(linear(x)).
        scores = self.selection(x)
        scores = scores / scores.sum(-1, keepdim=True).clamp_min(1e-12)
        log_weights = nn.functional.logsigmoid(self.selection_sharpness * (scores - self.selection_threshold))
        # The mixture uses u* / Σu*, unchanged by a common factor: rescaled so that the largest is 1, the
        # weights cannot all underflow (all scores 0 give u* = sigmoid(-a b) ≈ 1e-13 each at the defaults).
        weights = (log_weights - log_weights.amax(-1, keepdim=True)).exp()
        encoded = self._encode(self._to_inputs(self.pseudo_inputs)).base_dist
        # The recognition model may give γ = 1 exactly (log γ = -ReLU(-v)); a
        # prior component without an atom would make the KL from any posterior
        # with one infinite.
        gate = encoded.gate.clamp(1e-6, 1 - 1e-6)
        return SelectedSpikeAndSlab(weights, SpikeAndSlab(gate, encoded.loc, encoded.scale),
                                    kl_objective="selection_weighted")

    def sparsity_penalty(self, prior):
        """KL(Bernoulli(mean spike probability of the pseudo-inputs) ‖ Bernoulli(α)), summed over k."""
        mean_gate = prior.components.gate.mean(0).clamp(1e-6, 1 - 1e-6)
        alpha = self.alpha
        return (
            mean_gate * (mean_gate / alpha).log() + (1 - mean_gate) * ((1 - mean_gate) / (1 - alpha)).log()
        ).sum()

    def sample(self, x, kl_weight):
        prior = self.distribution(x)
        with poutine.scale(scale=kl_weight):
            # Once per data point and by β, as the code's own KL (not by the KL warm-up, which scales latents).
            pyro.factor("prior_sparsity", -self.sparsity_penalty(prior).expand(x.shape[:1]))
            return pyro.sample("z", prior)


class ThresholdedPrior(LatentPrior):
    r"""
    Codes z = T(s; λ0, 0), base draws s ~ Laplace(0, b0) or N(0, σ0²) through
    the shifted soft-threshold (Fallah & Rozell 2022, Eq. 2); for the Laplace
    base z is exactly spike-and-slab with γ = exp(-λ0/b0) (Prop. 3.1).  With
    ``learn_threshold`` λ is a local latent with a Gamma(α0, α0/λ0) prior (mean
    λ0; Sec. 3.2, Appendix B) and its own KL weight ``threshold_beta`` (β2;
    ``None``: β1/10, the ratio of Appendix D, whatever the model's β1).
    With ``learn_prior_threshold`` the prior's own threshold is one global
    λ_k per code, point-estimated (MAP) under the same Gamma(α0, α0/λ0): the
    prior's share of exact zeros, 1 - exp(-λ_k/b0) for the Laplace base, is
    then fitted to the data per code (empirical Bayes) instead of fixed, so a
    code that the data need dense is not charged the KL of a gate kept shut
    a priori, and an unused code is not charged for one kept open.

    The guide's codes are thresholded base draws too
    (:class:`~pyro_sparse.guides.ThresholdedGuide`), with a threshold that is

    * ``amortized_threshold=True`` (the default unless ``learn_threshold`` or
      ``kl="base"``): the encoder's own λ_q(x) per
      data point and coordinate, so that a code can be switched on with
      little noise.  With the paper's λ_q = λ0 the probability of being on,
      exp(-λ0/b), is tied to the noise scale b: a coordinate that is on with
      probability 1/2 (the posterior mode, see ``transform``) carries noise
      of scale b = λ0/ln 2 ≈ 1.44 λ0, and the ELBO prefers to leave it off;
    * ``amortized_threshold=False``: λ0 (or, with ``learn_threshold``, a
      Gamma draw), the paper's fixed and learned thresholds.

    :param str base: ``"laplace"`` or ``"gaussian"``.
    :param float threshold: λ0 > 0; ``None`` for no threshold (plain Laplace /
        Gaussian codes).  The registered names use the paper's defaults
        (Appendix D): 0.25 with b0 = 0.1 (Laplace), 0.52 with σ0 = √0.1
        (Gaussian), ~10% non-zero codes a priori; the models with unit-scale
        codes of their own give other defaults (``prior_defaults`` in
        :mod:`pyro_sparse.registry`).
    :param float prior_scale: b0 or σ0 (> 0).
    :param bool learn_prior_threshold: learn the prior's λ_k per code (global,
        MAP; the site ``"prior_threshold"``); ``None``: learn it wherever it
        applies, that is unless ``learn_threshold``, ``kl="base"`` or
        ``threshold=None`` (the models' unit-scale defaults use this).
    :param str kl: the code KL the ELBO uses (module docstring of
        :mod:`pyro_sparse.distributions.thresholded`): ``"exact"`` (the KL of
        the thresholded laws), ``"augmented"`` (Laplace only: the KL of the
        gate and the slab value, an upper bound on the exact KL that keeps the
        location of a switched-off code anchored at the prior) or ``"base"``
        (the paper's Eq. 5, with a threshold shared by q and p: it does not
        see an amortised threshold).
    """

    guide_family = "thresholded"
    site = "prior_threshold"
    # Files written while β2 did not follow β1 were trained with 0.1.
    former_defaults = {"threshold_beta": 0.1}
    # Options that act only with a threshold, or only on a learned one.
    option_conditions = {"threshold_beta": ("learn_threshold", (True,)),
                         # learn_prior_threshold=None: learned where the model's defaults allow (ssl_dgm, vae, ...).
                         "threshold_concentration": [("learn_threshold", (True,)),
                                                     ("learn_prior_threshold", (True, None))],
                         **{name: ("threshold", "given") for name in ("amortized_threshold", "kl")}}

    def __init__(
        self, latent_dim, base, threshold, prior_scale, learn_threshold=False, threshold_concentration=3.0,
        threshold_beta=None, amortized_threshold=None, kl="exact", learn_prior_threshold=False,
    ):
        super().__init__(latent_dim)
        if base not in ("laplace", "gaussian"):
            raise ValueError(f"base must be 'laplace' or 'gaussian', got {base!r}")
        if learn_prior_threshold is None:
            learn_prior_threshold = not learn_threshold and kl != "base" and threshold is not None
        for name, learned in [("learn_threshold", learn_threshold), ("learn_prior_threshold", learn_prior_threshold)]:
            if threshold is None and learned:
                raise ValueError(f"{name} needs a threshold λ0 for its Gamma prior")
        if learn_prior_threshold and not threshold_concentration >= 1:
            raise ValueError(f"learn_prior_threshold needs threshold_concentration >= 1, got "
                             f"{threshold_concentration!r}: below 1 the Gamma prior's density is unbounded at 0 "
                             "and the MAP threshold runs there")
        if learn_threshold and learn_prior_threshold:
            raise ValueError("learn_threshold (a local λ per data point) and learn_prior_threshold (a global λ per "
                             "code) exclude each other: pass one of them")
        if amortized_threshold is None:
            amortized_threshold = not learn_threshold and kl != "base"
        # Plain codes (threshold=None) have no threshold to amortise.
        amortized_threshold = bool(amortized_threshold) and threshold is not None
        if learn_threshold and amortized_threshold:
            raise ValueError("learn_threshold (a Gamma posterior of λ) and amortized_threshold (the encoder's λ) "
                             "exclude each other: pass amortized_threshold=False with learn_threshold=True")
        for name, value in [("threshold", 1.0 if threshold is None else threshold), ("prior_scale", prior_scale),
                            ("threshold_beta", 1.0 if threshold_beta is None else threshold_beta),
                            ("threshold_concentration", threshold_concentration)]:
            positive_number(name, value)
        kls = ("exact", "augmented", "base") if base == "laplace" else ("exact", "base")
        if kl not in kls:
            raise ValueError(f"kl must be one of {kls} with the {base} base, got {kl!r}")
        if kl == "base" and learn_prior_threshold:
            raise ValueError("kl='base' (the paper's Eq. 5) ignores the thresholds, so it cannot fit the prior's: "
                             "pass kl='exact' or 'augmented' with learn_prior_threshold")
        if kl == "base" and amortized_threshold:
            raise ValueError("kl='base' (the paper's Eq. 5) ignores the thresholds, so it cannot regularise an "
                             "amortised threshold: pass amortized_threshold=False, or kl='exact'")
        self.base, self.learn_threshold = base, bool(learn_threshold)
        self.learn_prior_threshold = bool(learn_prior_threshold)
        self.amortized_threshold = amortized_threshold
        self._sampled_threshold = None
        self.threshold = None if threshold is None else float(threshold)
        self.prior_scale, self.threshold_concentration = float(prior_scale), float(threshold_concentration)
        self.threshold_beta = None if threshold_beta is None else float(threshold_beta)
        self.kl = kl

    def guide_options(self):
        return {
            "base": self.base,
            "threshold": self.threshold,
            "learn_threshold": self.learn_threshold,
            "amortized_threshold": self.amortized_threshold,
            "threshold_kl_weight": self.threshold_beta,
            "prior_scale": self.prior_scale,
        }

    def _codes(self, x, threshold):
        return code_distribution(
            self.base, x.new_zeros(self.latent_dim), self.prior_scale, threshold, kl_objective=self.kl
        ).to_event(1)

    def _threshold_prior(self, like):
        concentration = like.new_full((self.latent_dim,), self.threshold_concentration)
        return dist.Gamma(concentration, concentration / self.threshold).to_event(1)

    def point_estimate_sites(self):
        if not self.learn_prior_threshold:
            return {}
        return {self.site: (torch.full((self.latent_dim,), self.threshold), constraints.positive)}

    def sample_globals(self, like):
        if self.learn_prior_threshold:
            self._sampled_threshold = pyro.sample(self.site, self._threshold_prior(like))

    def distribution(self, x):
        """p(z) at the prior threshold: λ0, the learned λ_k, or for a local learned threshold its prior mean."""
        if self.learn_prior_threshold:
            if self._sampled_threshold is None:
                raise RuntimeError("a learned prior threshold is sampled by the model (sample_globals) "
                                   "before the codes")
            return self._codes(x, self._sampled_threshold)
        return self._codes(x, None if self.threshold is None else x.new_full((self.latent_dim,), self.threshold))

    def sample(self, x, kl_weight):
        if not self.learn_threshold:
            return super().sample(x, kl_weight)
        with poutine.scale(scale=kl_weight / 10 if self.threshold_beta is None else self.threshold_beta):
            threshold = pyro.sample("threshold", self._threshold_prior(x))
        with poutine.scale(scale=kl_weight):
            return pyro.sample("z", self._codes(x, threshold))


class ThresholdedLaplacePrior(ThresholdedPrior):
    """Soft-thresholded Laplace(0, b0) codes; see :class:`ThresholdedPrior`."""

    def __init__(self, latent_dim, threshold=0.25, prior_scale=0.1, learn_threshold=False,
                 threshold_concentration=3.0, threshold_beta=None, amortized_threshold=None, kl="exact",
                 learn_prior_threshold=False):
        super().__init__(latent_dim, "laplace", threshold, prior_scale, learn_threshold, threshold_concentration,
                         threshold_beta, amortized_threshold, kl, learn_prior_threshold)


class ThresholdedNormalPrior(ThresholdedPrior):
    """Soft-thresholded N(0, σ0²) codes (the paper's Gaussian "spread" 0.1 is σ0²); see :class:`ThresholdedPrior`."""

    def __init__(self, latent_dim, threshold=0.52, prior_scale=math.sqrt(0.1), learn_threshold=False,
                 threshold_concentration=3.0, threshold_beta=None, amortized_threshold=None, kl="exact",
                 learn_prior_threshold=False):
        super().__init__(latent_dim, "gaussian", threshold, prior_scale, learn_threshold, threshold_concentration,
                         threshold_beta, amortized_threshold, kl, learn_prior_threshold)


class DistributionPrior(LatentPrior):
    """
    A user's Pyro distribution as the prior of z.

    :param prior: a ``TorchDistribution`` instance — scalar (expanded to K
        independent coordinates), with batch shape (K,), or with event shape
        (K,) — or a factory ``f(latent_dim)`` returning one.  A factory that
        is an ``nn.Module`` is copied into this prior as a submodule, so its
        parameters (learnable hyperparameters) are fitted with the model,
        follow it to the GPU and are saved with it; the user's object is left
        as it was.  The plain tensors a distribution holds (an instance's,
        or those a factory creates) are moved to the model's device when the
        prior is sampled, so a prior written for the CPU also trains on CUDA.
    :param int latent_dim: K.
    """

    def __init__(self, prior, latent_dim):
        super().__init__(latent_dim)
        if isinstance(prior, type):
            raise TypeError(
                f"latent_prior must be a distribution instance or a factory, got the class {prior.__name__}; "
                f"pass an instance, e.g. {prior.__name__}(...), or a function of latent_dim returning one"
            )
        if isinstance(prior, Distribution):
            self.instance, self.factory = prior, None
        elif callable(prior):
            self.instance, self.factory = None, own_copy(prior)
        else:
            raise TypeError(f"latent_prior must be a name, a Pyro distribution or a factory, got {prior!r}")
        built = self._build()
        # The registry pairs a guide with the user's distribution by this type.
        self.distribution_type = type(built)
        self._as_code_distribution(built)  # shape and support checked now, not at the first step
        # Where the model lives (Module.to() moves this empty buffer): distribution() moves the user's tensors there.
        self.register_buffer("device_marker", torch.empty(0), persistent=False)

    def _build(self):
        built = self.instance if self.factory is None else self.factory(self.latent_dim)
        if not isinstance(built, Distribution):
            raise TypeError(f"the latent_prior factory must return a Pyro distribution, got {type(built).__name__}")
        return built

    def _as_code_distribution(self, prior):
        K, name = self.latent_dim, type(prior).__name__
        shapes = f"batch shape {tuple(prior.batch_shape)} and event shape {tuple(prior.event_shape)}"
        if not is_real_support(prior.support):
            raise ValueError(f"latent_prior {name} has support {prior.support}; codes z are real-valued")
        if prior.event_shape == (K,) and prior.batch_shape == ():
            return prior
        if prior.event_shape == () and len(prior.batch_shape) <= 1 and prior.batch_shape in ((), (1,), (K,)):
            return prior.expand((K,)).to_event(1)
        raise ValueError(
            f"latent_prior {name} has {shapes}, but codes of latent_dim={K} need a scalar distribution, "
            f"batch shape ({K},) or event shape ({K},)"
        )

    def distribution(self, x):
        device = self.device_marker.device
        if self.factory is None:
            self.instance = on_device(self.instance, device)  # moved once, not at every step
        return self._as_code_distribution(unshared(on_device(self._build(), device)))


__all__ = [
    "DistributionPrior",
    "LatentPrior",
    "NormalPrior",
    "CorrelatedNormalPrior",
    "PseudoInputPrior",
    "SpikeSlabPrior",
    "ThresholdedLaplacePrior",
    "ThresholdedNormalPrior",
    "ThresholdedPrior",
]
