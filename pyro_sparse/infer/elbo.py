"""Multi-particle ELBOs that reduce over particles per data point (max-ELBO sampling)."""

import logging
import threading
from typing import NamedTuple

import pyro.util
import torch
from pyro import poutine
from pyro.distributions import ExpandedDistribution
from pyro.distributions.util import scale_and_mask
from pyro.infer import TraceMeanField_ELBO
from pyro.infer.util import check_fully_reparametrized, torch_item
from pyro.util import warn_if_nan
from torch.distributions import kl_divergence

from pyro_sparse.plates import in_data_plate

_PARTICLE_PLATE = "num_particles_vectorized"  # the outer plate added by pyro.infer.ELBO


class ParticleTerms(NamedTuple):
    """
    The ELBO terms of J particles, split into

    * ``local``  (J, B): e_ij, the terms of data point i under particle j
      (all sites in the data plate, already scaled: N/B, β, KL warm-up);
    * ``global_`` (J,): g_j, the sum of every term outside the data plate
      (global priors / KLs of point-estimated sites, factors, ...).
    """

    local: torch.Tensor
    global_: torch.Tensor


def _collapse(value, particle_dim, data_dim):
    """
    Sum a site's (scaled) log-density tensor over every dim except the
    particle dim and, if ``data_dim`` is given, the data dim: shape (P, B) or
    (P,), where P is J or 1 (a term that was not broadcast over particles),
    and B the batch or 1.  ``particle_dim=None`` means there is no particle
    plate (J = 1): a leading dim of size 1 is added.
    """
    if not torch.is_tensor(value):
        value = torch.as_tensor(value)
    keep_rel = [d for d in (particle_dim, data_dim) if d is not None]
    need = max((-d for d in keep_rel), default=0)
    if value.dim() < need:
        value = value.reshape((1,) * (need - value.dim()) + value.shape)
    keep = [value.dim() + d for d in keep_rel]
    others = [d for d in range(value.dim()) if d not in keep]
    if others:
        value = value.sum(others)
    if particle_dim is None:
        value = value.unsqueeze(0)
    return value


_GUESSING = threading.local()


def _quiet_guess(record):
    """
    A logging filter: drop Pyro's "Guessed max_plate_nesting" line while this
    thread runs our guess.  Installed once (adding and removing it around each
    guess would let concurrent fits remove each other's filter).
    """
    return not (getattr(_GUESSING, "active", False) and record.getMessage().startswith("Guessed max_plate_nesting"))


logging.getLogger("pyro.infer.elbo").addFilter(_quiet_guess)


class MaxParticleELBO(TraceMeanField_ELBO):
    r"""
    The mean-field ELBO with J vectorised particles, reduced over particles
    *per data point*: the max-ELBO sampling of Fallah & Rozell (2022),
    Sec. 3.3, or the ordinary J-sample average.

    One pass draws J particles z_ij ~ q(z | x_i) for every data point of the
    minibatch (Pyro's ``vectorize_particles``: the model and guide run inside
    an outer plate of size J).  For data point i and particle j the per-point
    ELBO term (Eq. 6) is

    .. math::

        e_{ij} = \log p(x_i \mid z_{ij}) - \mathrm{KL}\big(q(z \mid x_i) \,\|\, p(z)\big)

    summed over the sample sites in the data plate, with each site's scale
    (the N/B minibatch factor of the subsampled data plate, β of a β-VAE, the
    KL warm-up of :class:`pyro_sparse.infer.handlers.scale_local_latents`).  As in
    :class:`~pyro.infer.TraceMeanField_ELBO` the KL is analytic where the
    torch KL registry has one (it is then identical across particles unless
    the prior depends on an upstream latent), else the single-sample
    estimate log p(z_ij) - log q(z_ij | x_i).  Every term *outside* the data
    plate (priors of point-estimated global sites, i.e. the KL of a Delta
    guide, or a ``pyro.factor`` on globals) forms g_j.  The objective is

    .. math::

        \mathcal L = \sum_i \operatorname{red}_j e_{ij} + \frac1J \sum_j g_j

    with ``red = max`` for ``particle_reduction="max"`` (Eq. 9,
    :math:`\widehat{\mathcal L}^k_{max} = \max_j \mathcal L^{j,k}`; the gradient
    flows through the best particle of each data point only) or
    ``red = mean`` for ``"mean"`` (Eq. 7, :math:`\widehat{\mathcal L}^k_{avg}`,
    the usual J-sample ELBO estimate, equal to ``TraceMeanField_ELBO`` with
    ``num_particles=J, vectorize_particles=True``; with the very same draws
    when ``max_plate_nesting`` is given to both).  Since e_ij carries the
    sites' scales, the best particle is chosen under the β / warm-up weighted
    KL, as in Eq. 6.  Global terms are averaged
    over particles, never maxed: a max over whole-dataset sums would pick the
    particle with the best *batch*, which is not the paper's per-point rule.

    .. warning:: With ``"max"`` and J > 1 the objective is **not** a lower
       bound of log p(x): E[max_j e_ij] >= E[e_ij], and the estimate is biased
       upward (the paper's training heuristic, motivated by the MAP
       approximation of Eq. 8).  Do not compare its values with ELBOs or use
       it for model selection; evaluate held-out likelihoods instead.  With
       J = 1 both reductions equal ``TraceMeanField_ELBO`` exactly (same
       draws, values and gradients).

    :meth:`differentiable_loss` returns -L as a scalar tensor (what
    :func:`pyro_sparse.infer.loop.fit` calls), :meth:`loss` a float and
    :meth:`loss_and_grads` backpropagates, so it also plugs into
    :class:`pyro.infer.SVI`.

    Requirements: static model structure and networks that broadcast over a
    leading particle dim (else pass ``vectorize_particles=False``), a fully
    reparameterised mean-field guide (as for TraceMeanField_ELBO; checked at
    every call, since the particle selection admits no score-function
    gradient), and a vectorised data plate named ``data_plate`` (``"data"``
    in this library, see :func:`pyro_sparse.plates.data_plate`).

    :param int num_particles: J (the paper uses J = 20).
    :param str particle_reduction: ``"max"`` (Eq. 9) or ``"mean"`` (Eq. 7).
    :param int max_plate_nesting: number of nested plates in the model and
        guide, *not* counting the particle plate (1 for a model with only the
        data plate at dim -1; the particle plate then goes to dim -2).  By
        default it is guessed, like Pyro does, from one trace of the model and
        guide on the first call (which assumes static structure); the random
        state is restored afterwards so the guess does not shift the draws.
    :param str data_plate: name of the plate over data points.
    :param bool vectorize_particles: ``True`` (default) draws the J particles
        in one pass inside an outer plate at dim ``-max_plate_nesting``;
        ``False`` runs J single-particle passes and stacks their terms (same
        objective, J times the passes) for models whose networks cannot take
        an extra leading batch dim (e.g. the masked decoder of ``ssl_dgm``).
    """

    def __init__(
        self,
        num_particles=1,
        particle_reduction="max",
        max_plate_nesting=float("inf"),
        data_plate="data",
        vectorize_particles=True,
        **kwargs,
    ):
        if not isinstance(num_particles, int) or isinstance(num_particles, bool) or num_particles < 1:
            raise ValueError(f"num_particles must be a positive integer, got {num_particles!r}")
        if particle_reduction not in ("max", "mean"):
            raise ValueError(f"particle_reduction must be 'max' or 'mean', got {particle_reduction!r}")
        super().__init__(
            num_particles=num_particles,
            max_plate_nesting=max_plate_nesting,
            vectorize_particles=bool(vectorize_particles),
            **kwargs,
        )
        self.particle_reduction = particle_reduction
        self.data_plate = data_plate

    # ------------------------------------------------------------------ traces

    def _guess_max_plate_nesting(self, model, guide, args, kwargs):
        # The guess runs the guide once; restore the random state so the first
        # step draws what it would have drawn with max_plate_nesting given.
        # Pyro logs the guess at INFO on every train call; the library's own INFO lines are what users read.
        state = pyro.util.get_rng_state()
        cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        _GUESSING.active = True
        try:
            super()._guess_max_plate_nesting(model, guide, args, kwargs)
        finally:
            _GUESSING.active = False
            pyro.util.set_rng_state(state)
            if cuda_state is not None:
                torch.cuda.set_rng_state_all(cuda_state)

    def _get_traces(self, model, guide, args, kwargs):
        """
        (model trace, guide trace, particles in it) pairs: one vectorised pass
        with all J particles, or J single-particle passes.
        """
        if not self.vectorize_particles or self.num_particles == 1:
            # No particle plate, so no plate dim needs to be known; with J = 1
            # this is exactly TraceMeanField_ELBO's trace (and RNG use).
            for _ in range(self.num_particles):
                yield (*self._get_trace(model, guide, args, kwargs), 1)
            return
        if self.max_plate_nesting == float("inf"):
            self._guess_max_plate_nesting(model, guide, args, kwargs)
        yield (*self._get_vectorized_trace(model, guide, args, kwargs), self.num_particles)

    # ------------------------------------------------------------------ terms

    def _frame_dims(self, site, num_particles):
        """The site's particle dim (None without a particle plate) and data-plate dim (None outside it)."""
        particle_dim = data_dim = None
        for frame in site["cond_indep_stack"]:
            if frame.name == _PARTICLE_PLATE:
                particle_dim = frame.dim
            elif frame.name == self.data_plate:
                if not frame.vectorized or frame.dim is None:
                    raise ValueError(f"MaxParticleELBO needs a vectorised plate {self.data_plate!r}")
                data_dim = frame.dim
        if particle_dim is None and num_particles > 1:
            particle_dim = -self.max_plate_nesting  # not broadcast: size 1 there
        return particle_dim, data_dim

    def _site_terms(self, model_trace, guide_trace, num_particles):
        """(value, particle_dim, data_dim, name) for every ELBO term of a pair of traces."""
        terms = []
        for name, model_site in model_trace.nodes.items():
            if model_site["type"] != "sample":
                continue
            dims = self._frame_dims(model_site, num_particles)
            if model_site["is_observed"]:  # observations and pyro.factor
                terms.append((model_site["log_prob"], *dims, name))
                continue
            guide_site = guide_trace.nodes[name]
            # Selecting a particle is not differentiable: only pathwise
            # (reparameterised) gradients are right here, validation or not.
            check_fully_reparametrized(guide_site)
            try:
                kl_qp = kl_divergence(guide_site["fn"], model_site["fn"])
            except NotImplementedError:
                # log p(z_ij) - log q(z_ij | x_i), both with their sites' scales.
                terms.append((model_site["log_prob"], *dims, name))
                terms.append((-guide_site["score_parts"].entropy_term, *dims, name))
            else:
                if not torch.is_tensor(kl_qp):
                    kl_qp = torch.as_tensor(kl_qp).expand(guide_site["fn"].batch_shape)
                kl_qp = scale_and_mask(kl_qp, scale=guide_site["scale"], mask=guide_site["mask"])
                terms.append((-kl_qp, *dims, name))
        for name, guide_site in guide_trace.nodes.items():
            if guide_site["type"] == "sample" and name not in model_trace.nodes:
                if not guide_site["infer"].get("is_auxiliary"):
                    raise ValueError(f"guide site {name!r} is not in the model and not marked auxiliary")
                check_fully_reparametrized(guide_site)
                dims = self._frame_dims(guide_site, num_particles)
                terms.append((-guide_site["score_parts"].entropy_term, *dims, name))
        return terms

    def _particle_terms(self, model_trace, guide_trace, num_particles):
        """:class:`ParticleTerms` of one pair of traces holding ``num_particles`` particles."""
        J = num_particles
        local, global_ = [], []
        for value, particle_dim, data_dim, name in self._site_terms(model_trace, guide_trace, J):
            collapsed = _collapse(value, particle_dim, data_dim)
            if collapsed.shape[0] not in (1, J):
                raise ValueError(f"site {name!r}: particle dim of size {collapsed.shape[0]}, expected {J}")
            if data_dim is None:
                global_.append(collapsed.expand(J))
            else:
                local.append((name, collapsed))
        sizes = {t.shape[-1] for _, t in local}
        B = max(sizes, default=1)
        for name, t in local:
            if t.shape[-1] != B:
                # One value for a batch of B > 1 points cannot be split among them.
                raise ValueError(
                    f"site {name!r} in plate {self.data_plate!r} has size {t.shape[-1]} at the "
                    f"plate's dim where other sites have {B}"
                )
        reference = next(iter([*global_, *(t for _, t in local)]), torch.zeros(()))
        local_sum = sum((t.expand(J, B) for _, t in local), reference.new_zeros(J, B))
        global_sum = sum(global_, reference.new_zeros(J))
        return ParticleTerms(local_sum, global_sum)

    def particle_terms(self, model, guide, *args, **kwargs):
        """
        Draw J particles and return their :class:`ParticleTerms`: e_ij of shape
        (J, B) and g_j of shape (J,), differentiable.  B is 1 (a column of
        zeros) for a model without a data plate.
        """
        per_trace = [self._particle_terms(*traces) for traces in self._get_traces(model, guide, args, kwargs)]
        if len(per_trace) == 1:
            return per_trace[0]
        return ParticleTerms(*(torch.cat(parts) for parts in zip(*per_trace)))

    def _reduce(self, terms):
        """L: the data-point terms reduced over particles and summed, plus the particle mean of g."""
        if self.particle_reduction == "max":
            local = terms.local.max(0).values  # gradient through the argmax particle of each point
        else:
            local = terms.local.mean(0)
        return local.sum() + terms.global_.mean()

    # ------------------------------------------------------------------ losses

    def differentiable_loss(self, model, guide, *args, **kwargs):
        """-L (see the class docstring) as a differentiable scalar tensor."""
        loss = -self._reduce(self.particle_terms(model, guide, *args, **kwargs))
        warn_if_nan(loss, "loss")
        return loss

    def loss(self, model, guide, *args, **kwargs):
        """-L as a float."""
        with torch.no_grad():
            return torch_item(self.differentiable_loss(model, guide, *args, **kwargs))

    def loss_and_grads(self, model, guide, *args, **kwargs):
        """-L as a float, after backpropagating it (for :class:`pyro.infer.SVI`)."""
        loss = self.differentiable_loss(model, guide, *args, **kwargs)
        if loss.requires_grad:
            loss.backward(retain_graph=self.retain_graph)
        return torch_item(loss)

    def _differentiable_loss_particle(self, model_trace, guide_trace):
        raise NotImplementedError("MaxParticleELBO reduces over particles jointly; use differentiable_loss")


class KLTerm(NamedTuple):
    """How the mean-field ELBOs compute the KL term of one local latent site."""

    site: str
    guide: str
    prior: str
    closed_form: bool

    def describe(self):
        if self.closed_form:
            return f"site {self.site!r}: KL({self.guide} || {self.prior}) in closed form (torch.distributions.kl)"
        return (
            f"site {self.site!r}: no closed-form KL({self.guide} || {self.prior}) is registered, so the ELBO uses "
            f"the Monte-Carlo estimate log q(z) - log p(z); register one with torch.distributions.kl.register_kl"
        )


def _distribution_name(fn):
    while isinstance(fn, (torch.distributions.Independent, ExpandedDistribution)):
        fn = fn.base_dist
    return type(fn).__name__


def kl_terms(model, guide, x, **kwargs):
    """
    For each latent site inside the data plate, whether
    ``kl_divergence(q, p)`` is registered for its guide and prior — as
    :class:`~pyro.infer.TraceMeanField_ELBO` and :class:`MaxParticleELBO`
    try first — or the ELBO falls back to a Monte-Carlo estimate.  One trace
    of ``guide`` and ``model`` on ``x``.
    """
    with torch.no_grad():
        guide_trace = poutine.trace(guide).get_trace(x, **kwargs)
        model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(x, **kwargs)
    terms = []
    for name, site in model_trace.nodes.items():
        if site["type"] != "sample" or site["is_observed"] or not in_data_plate(site):
            continue
        q, p = guide_trace.nodes[name]["fn"], site["fn"]
        try:
            kl_divergence(q, p)
            closed_form = True
        except NotImplementedError:
            closed_form = False
        terms.append(KLTerm(name, _distribution_name(q), _distribution_name(p), closed_form))
    return terms
