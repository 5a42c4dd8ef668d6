import math

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import constraints
from torch.distributions.utils import broadcast_all


class GroupLasso(TorchDistribution):
    r"""
    The density whose negative log is a group-lasso penalty on one group of
    ``dim`` coefficients: for :math:`w \in \mathbb R^d`,

    .. math::

        p(w) = \frac{\lambda^d\,\Gamma(d/2)}{2\pi^{d/2}\,\Gamma(d)}\; e^{-\lambda \lVert w \rVert_2},

    so ``-log p`` is :math:`\lambda \lVert w \rVert_2` plus a constant (the
    prior behind the oi-VAE penalty of Ainsworth et al. 2018).  The radius
    ‖w‖ is Gamma(d, λ) and the direction uniform on the sphere; for d = 1 this
    is the Laplace(0, 1/λ) density. Since E‖w‖ = d/λ the (differential)
    entropy is d - log C, C the normaliser above. A multivariate law, it has no
    ``cdf``; its shapes depend on the integer ``dim``, not on a tensor shape,
    so ``infer_shapes`` is not available either.

    :param torch.Tensor rate: λ > 0.
    :param int dim: d, the size of a group (the event shape is ``(dim,)``).
    """

    arg_constraints = {"rate": constraints.positive}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, rate, dim, validate_args=None):
        if not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        (self.rate,) = broadcast_all(rate)
        self.dim = dim
        super().__init__(self.rate.shape, torch.Size((dim,)), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(GroupLasso, _instance)
        batch_shape = torch.Size(batch_shape)
        new.rate = self.rate.expand(batch_shape)
        new.dim = self.dim
        super(GroupLasso, new).__init__(batch_shape, self.event_shape, validate_args=False)
        new._validate_args = self._validate_args
        return new

    @property
    def mean(self):
        return self.rate.new_zeros(self.batch_shape + self.event_shape)

    @property
    def variance(self):
        # E‖w‖² = d(d+1)/λ², shared equally by the d coordinates.
        return ((self.dim + 1) / self.rate**2).unsqueeze(-1).expand(self.batch_shape + self.event_shape)

    def _log_normalizer(self):
        d = self.dim
        return d * torch.log(self.rate) + math.lgamma(d / 2) - math.log(2) - (d / 2) * math.log(math.pi) - math.lgamma(d)

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        return self._log_normalizer() - self.rate * torch.linalg.vector_norm(value, dim=-1)

    def entropy(self):
        # -E log p = -log C + λ E‖w‖, and E‖w‖ = d/λ for the Gamma(d, λ) radius.
        return self.dim - self._log_normalizer()

    def rsample(self, sample_shape=torch.Size()):
        shape = self._extended_shape(sample_shape)
        radius = torch.distributions.Gamma(torch.full_like(self.rate, float(self.dim)), self.rate).rsample(sample_shape)
        direction = torch.randn(shape, dtype=self.rate.dtype, device=self.rate.device)
        direction = direction / torch.linalg.vector_norm(direction, dim=-1, keepdim=True)
        return radius.unsqueeze(-1) * direction
