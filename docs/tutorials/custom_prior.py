"""
Tutorial: write a new latent prior as a Pyro distribution and train with it.

A Student-t prior on the codes z (heavy tails: a few large activations per
data point, many small ones) in about thirty lines: ``log_prob``,
``rsample`` and ``expand`` are all pyro_sparse needs.  No KL between the
Gaussian guide and a Student-t has a closed form, so the ELBO uses the
Monte-Carlo estimate log q(z) - log p(z), and ``train`` logs that it does.
Registering a KL with ``torch.distributions.kl.register_kl`` (for a pair
that has one) switches to it.  The test suite runs this script.

    python docs/tutorials/custom_prior.py
"""

import argparse
import logging
import math

import torch
from pyro.distributions import TorchDistribution
from torch.distributions import Chi2, constraints
from torch.distributions.utils import broadcast_all

import pyro_sparse
from pyro_sparse.data.synthetic import synthetic_sparse_dgm


class StudentT(TorchDistribution):
    """Student-t with ``df`` degrees of freedom and scale ``scale``, centred at 0."""

    arg_constraints = {"df": constraints.positive, "scale": constraints.positive}
    support = constraints.real
    has_rsample = True

    def __init__(self, df, scale=1.0, validate_args=None):
        self.df, self.scale = broadcast_all(df, scale)
        super().__init__(self.df.shape, validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(StudentT, _instance)
        new.df, new.scale = self.df.expand(batch_shape), self.scale.expand(batch_shape)
        super(StudentT, new).__init__(torch.Size(batch_shape), validate_args=False)
        new._validate_args = self._validate_args
        return new

    def rsample(self, sample_shape=torch.Size()):
        # t = ε·sqrt(ν / c) with ε ~ N(0, 1), c ~ χ²(ν): pathwise in the scale and in ν.
        shape = self._extended_shape(sample_shape)
        noise = torch.randn(shape, dtype=self.df.dtype, device=self.df.device)
        return self.scale * noise * (self.df / Chi2(self.df.expand(shape)).rsample()).sqrt()

    def log_prob(self, value):
        if self._validate_args:
            self._validate_sample(value)
        nu = self.df
        return (
            torch.lgamma((nu + 1) / 2) - torch.lgamma(nu / 2) - 0.5 * torch.log(nu * math.pi) - self.scale.log()
            - (nu + 1) / 2 * torch.log1p((value / self.scale) ** 2 / nu)
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    data = synthetic_sparse_dgm(n=500, rho=0.3)
    # One call: the sparse VAE's SSL-masked decoder with heavy-tailed codes.
    fitted = pyro_sparse.train("ssl_dgm", data.X, latent_dim=3, latent_prior=StudentT(df=3.0),
                               max_epochs=args.epochs, progress=False)
    heldout = synthetic_sparse_dgm(n=200, rho=0.3, seed=1).X
    print(f"heldout log-likelihood per point: {fitted.heldout_log_likelihood(heldout).mean():.2f}")
    print(f"non-zero entries of W: {(fitted.W_ != 0).sum()} of {fitted.W_.size}")
    return fitted


if __name__ == "__main__":
    main()
