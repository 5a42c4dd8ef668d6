"""The proximal steps of the group-lasso and horseshoe priors under a steady gradient, with the loop's cap."""

import math

import pytest
import torch

from pyro_sparse.infer.loop import adam_step_sizes
from pyro_sparse.priors import GroupLassoPrior, HorseshoePrior


def minimise(prior, start, target, steps=6000, lr=0.01):
    """Adam on 0.5 ||w - target||² - log prior(w) with the prior's hooks, as the training loop runs them."""
    w = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.Adam([w], lr=lr)
    prior.update(w.detach())
    for _ in range(steps):
        optimizer.zero_grad()
        loss = 0.5 * ((w - target) ** 2).sum() - prior.distribution().log_prob(w)
        loss.backward()
        prior.before_step(w)
        optimizer.step()
        prior.after_step(w, *adam_step_sizes(optimizer, w))
    return w.detach()


@pytest.mark.parametrize("group_dim", [1, 2, 5])
def test_a_group_shrinks_to_the_group_lasso_solution(group_dim):
    # ||target|| = 3, λ = 2: the solution has length 1.  A group's length grows by up to lr·√p per Adam step; a
    # shrink capped at lr lost to it for p ≥ 2 (length 2.3-2.4, near the unpenalised 3).
    target = torch.full((1, 1, group_dim), 3.0 / math.sqrt(group_dim))
    w = minimise(GroupLassoPrior(1, 1, group_dim, lam=2.0), 0.3 * target, target)
    assert torch.linalg.vector_norm(w).item() == pytest.approx(1.0, abs=0.05)


class FixedVariance(HorseshoePrior):
    """The horseshoe with its prior variance τv held at 0.25 (no sweeps): a ridge whose solution is 0.6."""

    def update(self, mask):
        pass


@pytest.mark.parametrize("start", [1.0, 3.0])
def test_the_horseshoe_shrink_reaches_its_ridge_solution(start):
    # 0.5 (w - 3)² + w² / (2 · 0.25): w = 0.6.  With the shrink capped at lr a steady gradient held w where it was.
    prior = FixedVariance(1, 1)
    prior.log_tau.fill_(math.log(0.25))
    w = minimise(prior, torch.tensor([[start]]), torch.tensor([[3.0]]))
    assert w.item() == pytest.approx(0.6, abs=0.01)
