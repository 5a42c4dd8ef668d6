"""The Spike-and-Slab Lasso prior of the decoder mask W with its EM hooks (Moran et al. 2022, Algorithm 1)."""

import warnings

import numpy as np
import torch

from pyro_sparse.checks import positive_number
from pyro_sparse.distributions import SpikeSlabLasso
from pyro_sparse.priors.site import SitePrior, gradient_averaging_weight, largest_shrink


class SpikeSlabLassoPrior(SitePrior):
    r"""
    The SSL prior on a (G, K) mask W with its EM updates (Moran et al. 2022,
    Algorithm 1 and Appendix B.1).

    * E-step: E[γ_jk | w_jk, η_k] (Eq. 57) and
      η_k = (Σ_j E[γ_jk] + a - 1) / (a + b + G - 2), kept as buffers and
      computed in float64 without autograd, so η never underflows to zero by
      rounding alone.
    * M-step for W: the E-step turns the prior term into a weighted lasso
      ``-Σ λ*_jk |w_jk|`` with λ* = λ*(w^(t), η^(t)) (Eq. 55, 58).  It is applied
      as a proximal step in the optimizer's own metric: ``before_step``
      removes the lasso's gradient λ*·sign(w) (which autograd put there via
      the SSL log-density) so the optimizer sees only the smooth part, and
      ``after_step`` soft-thresholds the new W by step_size·λ*.  Entries in
      the spike end exactly zero, as in the paper's Fig. 2d, and the penalty
      is weighed against the likelihood in the same units.  (Left inside an
      Adam step instead, a small but consistent penalty gradient moves W at
      the full learning rate and switches off columns before the decoder has
      learned to use them.)

    The loop's loss must be the full -ELBO (data term scaled by N / batch) so
    that gradients and λ* are in the same units.  The loss it reports holds
    -log SSL(W | η) with the indicators summed out (Eq. 51's exact term, not
    Eq. 53's bound, whose W-gradient is the same at the E-step's λ*) and
    leaves out log Beta(η | a, b), which enters only the η update: training
    losses of fits with different η differ from Eq. 53 by that term.

    :param int num_features: G.
    :param int latent_dim: K.
    :param float lambda0: spike rate (λ0 ≫ λ1).
    :param float lambda1: slab rate.
    :param float a: Beta(a, b) prior on η_k.
    :param float b: Beta(a, b) prior on η_k; ``None`` means G (Appendix C.2).
    :param float gradient_averaging: weight of the newest gradient in the
        running average that decides whether a zero entry may leave zero
        (0.01 averages over about 100 steps).
    :param lambda0_path: spike rates visited before ``lambda0``, increasing,
        each for ``lambda0_path_epochs`` epochs from the start of training: the
        dynamic posterior exploration of Ročková & George (2018, Sec. 4), a
        ladder of increasing λ0 where each rung warm-starts from the last.  A
        small λ0 (near λ1) first lets W find which entries the data use; the
        rising spike rate then moves the others to exactly zero.  ``None``:
        λ0 throughout.
    :param float lambda0_path_epochs: epochs per rung of ``lambda0_path``.
    :param initial_support: (G, K) booleans: W starts at 1 on them and at 0
        elsewhere, and a zero entry joins only when the zero test below lets
        it.  ``None``: 1 everywhere (Algorithm 1's dense start).  The start
        decides the structure: from the dense start W stays denser than the
        truth on correlated factors, from the true support it stays there
        (docs: Results, synthetic).
    :param int sparse_restart: how many times to fit again, each time from
        :meth:`restart_support` of the previous fit's W (each feature starts
        with one parent, its strongest); ``True`` is 1, ``False`` 0.  Each
        restart costs one more fit; a fit with restarts cannot resume from a
        checkpoint.
    """

    # A rung length acts only with rungs (train refuses it without a lambda0_path).
    option_conditions = {"lambda0_path_epochs": ("lambda0_path", "given")}

    def __init__(self, num_features, latent_dim, lambda0=10.0, lambda1=1.0, a=1.0, b=None, gradient_averaging=0.01,
                 lambda0_path=None, lambda0_path_epochs=10.0, initial_support=None, sparse_restart=False):
        super().__init__()
        lambda0, lambda1 = positive_number("lambda0", lambda0), positive_number("lambda1", lambda1)
        if lambda0 < lambda1:
            raise ValueError(
                f"the spike rate lambda0 ({lambda0}) must be at least the slab rate lambda1 ({lambda1})"
            )
        a, b = positive_number("a", a), float(num_features) if b is None else positive_number("b", b)
        self.lambda0, self.lambda1, self.a, self.b = lambda0, lambda1, a, b
        self.gradient_averaging = gradient_averaging_weight(gradient_averaging)
        self.gradient_averaging_scale = 1.0  # the model's: the share of features each step scores
        self.num_features = num_features
        self.lambda0_path = tuple(float(rate) for rate in lambda0_path) if lambda0_path is not None else ()
        rates = (self.lambda1, *self.lambda0_path, self.lambda0)
        if any(later < earlier for earlier, later in zip(rates, rates[1:])):
            raise ValueError(
                f"lambda0_path must increase from lambda1 ({self.lambda1}) towards lambda0 ({self.lambda0}), "
                f"got {self.lambda0_path}"
            )
        if not lambda0_path_epochs > 0:
            raise ValueError(f"lambda0_path_epochs must be positive, got {lambda0_path_epochs!r}")
        self.lambda0_path_epochs = float(lambda0_path_epochs)
        if initial_support is not None:
            initial_support = np.asarray(initial_support)
            if initial_support.shape != (num_features, latent_dim) or not np.isin(initial_support, (0, 1)).all():
                raise ValueError(f"initial_support must be ({num_features}, {latent_dim}) booleans (features x "
                                 f"factors), got {initial_support.dtype} values of shape {initial_support.shape}")
            initial_support = torch.as_tensor(initial_support.astype(bool))
        self.initial_support = initial_support
        if not (isinstance(sparse_restart, (int, np.integer)) and sparse_restart >= 0):
            raise ValueError(f"sparse_restart must be a number of restarts (0, 1, 2, ... or True/False), "
                             f"got {sparse_restart!r}")
        self.sparse_restart = int(sparse_restart)
        # The spike rate in force: a buffer, so checkpoints and loaded models keep where the path was.
        self.register_buffer("spike_rate", torch.tensor(rates[1]))
        self.register_buffer("eta", torch.full((latent_dim,), 0.5))
        self.register_buffer("inclusion_probs", torch.full((num_features, latent_dim), 0.5))
        self.register_buffer("average_gradient", torch.zeros(num_features, latent_dim))
        self.register_buffer("num_steps", torch.zeros((), dtype=torch.long))
        self._was_zero = None

    @torch.no_grad()
    def initialize(self, mask):
        """W's start: 1 on ``initial_support``, 0 elsewhere (unchanged without one)."""
        if self.initial_support is not None:
            mask.masked_fill_(~self.initial_support.to(mask.device), 0.0)

    @staticmethod
    def restart_support(mask):
        """
        The start of a sparse restart: each feature's entry of largest :math:`|w_{jk}|`
        (none for a feature whose row of W is zero).  In a dense fit on
        correlated factors the largest entries are mostly true ones and the
        others mostly false (docs: Results, synthetic), so the restart begins
        near the sparse structure the dense start cannot reach.
        """
        magnitude = torch.as_tensor(mask).abs()
        strongest = magnitude == magnitude.max(dim=1, keepdim=True).values
        strongest &= magnitude > 0
        return strongest & (strongest.cumsum(1) == 1)  # one entry per feature, the first of any ties

    def check_schedule(self, kl_warmup_epochs, max_epochs):
        """Before training: warn if the λ0 path outlasts the run, so that λ0 itself never applies."""
        end = len(self.lambda0_path) * self.lambda0_path_epochs
        if self.lambda0_path and end >= max_epochs:
            warnings.warn(
                f"the lambda0 path {list(self.lambda0_path)} ends at epoch {end:g} "
                f"({self.lambda0_path_epochs:g} per rung), not before max_epochs={max_epochs}: the fit never "
                f"reaches lambda0={self.lambda0:g}, which its file records; train longer or shorten the path",
                stacklevel=5,
            )

    def schedule(self, epoch, iteration):
        """Called by the training loop before each step: the spike rate of the current rung of the λ0 path."""
        rung = int(epoch // self.lambda0_path_epochs)
        self.spike_rate.fill_(self.lambda0_path[rung] if rung < len(self.lambda0_path) else self.lambda0)

    def _ssl(self, like):
        return SpikeSlabLasso(self.eta.to(like.dtype).expand_as(like), self.spike_rate.item(), self.lambda1)

    def distribution(self):
        """The prior of W as a Pyro distribution with event shape (G, K)."""
        eta = self.eta.expand(self.num_features, -1)
        return SpikeSlabLasso(eta, self.spike_rate.item(), self.lambda1).to_event(2)

    def penalty_weights(self):
        """λ* (Eq. 58) from the last E-step."""
        return self.lambda1 * self.inclusion_probs + self.spike_rate.item() * (1 - self.inclusion_probs)

    @torch.no_grad()
    def update(self, mask):
        """E-step (Eq. 57) then the closed-form η update of Algorithm 1."""
        w = mask.detach().double()
        probs = self._ssl(w).inclusion_probability(w)
        self.eta.copy_(self._eta_update(probs))
        self.inclusion_probs.copy_(probs)

    def _eta_update(self, probs):
        """
        η_k = (Σ_j E[γ_jk] + a - 1) / (a + b + G - 2), kept in (0, 1).  ``a - 1``
        is added as one number: Σ_j E[γ_jk] + a - 1 rounds sums below 1e-16 to
        0 when a = 1, and η_k could then never leave its floor however large the
        column's weights grow.
        """
        new_eta = (probs.sum(0) + (self.a - 1)) / (self.a + self.b + self.num_features - 2)
        return new_eta.clamp(torch.finfo(self.eta.dtype).tiny, 1 - 1e-6)

    @torch.no_grad()
    def before_step(self, mask):
        # d/dw of -log SSL(w) is exactly λ*(w)·sign(w); leave only the smooth part.
        mask.grad.sub_(self._ssl(mask).penalty_weight(mask) * mask.sign())
        self.num_steps += 1
        weight = max(self.gradient_averaging * self.gradient_averaging_scale, 1 / self.num_steps.item())
        self.average_gradient.lerp_(mask.grad.to(self.average_gradient.dtype), weight)
        self._was_zero = mask == 0

    @torch.no_grad()
    def after_step(self, mask, step_size, max_shift, strength=1.0):
        penalty = strength * self.penalty_weights()
        threshold = (step_size * penalty).clamp_max(largest_shrink(max_shift))
        mask.copy_(mask.sign() * (mask.abs() - threshold).clamp_min(0))
        # A zero entry stays zero until the gradient averaged over many steps
        # beats its penalty (the zero test of regularized dual averaging, Xiao
        # 2010).  Tested on one minibatch's gradient instead, spike entries
        # flicker off zero whenever the minibatch noise exceeds λ*.
        if self._was_zero is not None:
            mask.masked_fill_(self._was_zero & (self.average_gradient.abs() <= penalty), 0.0)
        self.update(mask)
