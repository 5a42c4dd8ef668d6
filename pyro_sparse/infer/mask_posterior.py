"""
The data's evidence about each entry of a point-estimated decoder mask W: a
Laplace approximation of its likelihood, row by row, for posterior support
probabilities beyond the E-step's E[γ | w].
"""

import torch
from pyro import poutine

from pyro_sparse.infer.importance import exact_guide_trace
from pyro_sparse.nn import evaluation_mode


def mask_log_likelihood_curvature(model, guide, batches, site="W", num_samples=4):
    r"""
    Gradient and curvature of :math:`L(W) = \sum_i E_{q(z_i | x_i)}[\log p(x_i | z_i, W)]`
    in the global site ``site`` at the guide's point estimate :math:`\hat W`,
    the other parameters held at their fitted values: the gradient
    :math:`g_j = ∂L/∂w_j` (G, K) and, for each row j, the K x K block
    :math:`H_j = -∂²L/∂w_j∂w_j^T` (G, K, K), float64, so that

    .. math:: L(W) \approx L(\hat W) + \sum_j g_j^T (w_j - \hat w_j) - \tfrac12 (w_j - \hat w_j)^T H_j (w_j - \hat w_j):

    a Gaussian likelihood of row j with mean :math:`\hat w_j + H_j^{-1} g_j`
    and covariance :math:`H_j^{-1}`.  The expectation over q is a mean over
    ``num_samples`` draws per data point.  The likelihood must factorise over
    features, each feature j depending on row j of W only (Moran et al. 2022,
    Eq. 1: x_ij reads f_θ(w_j ⊙ z_i)); then the Hessian is block-diagonal over
    rows and K Hessian-vector products (column k set to 1 in every row) give
    column k of every block.  A softmax over features (the multinomial)
    breaks this.

    The model and guide run in eval mode (every feature, batch-norm running
    statistics), their modes put back afterwards; the derivatives are taken
    in the decoder's precision (bfloat16 after a ``"bf16"`` fit, unless
    ``set_precision("fp32")``).

    :param batches: iterable of :class:`~pyro_sparse.data.dataset.Batch`.
    """
    with evaluation_mode(model, guide):
        return _sum_over_batches(model, guide, batches, site, num_samples)


def _sum_over_batches(model, guide, batches, site, num_samples):
    gradient = curvature = None
    for batch in batches:
        for _ in range(num_samples):
            guide_trace = exact_guide_trace(guide, batch.x, **batch.kwargs)  # codes drawn without gradients
            mask = guide_trace.nodes[site]["value"].detach().clone().requires_grad_(True)
            guide_trace.nodes[site]["value"] = mask
            model_trace = poutine.trace(poutine.replay(model, trace=guide_trace)).get_trace(batch.x, **batch.kwargs)
            log_likelihood = sum(
                node["fn"].log_prob(node["value"]).sum()
                for node in model_trace.nodes.values()
                if node["type"] == "sample" and node["is_observed"]
            )
            (grad,) = torch.autograd.grad(log_likelihood, mask, create_graph=True)
            if gradient is None:
                gradient = torch.zeros_like(mask, dtype=torch.float64)
                curvature = mask.new_zeros(*mask.shape, mask.shape[-1], dtype=torch.float64)
            for k in range(mask.shape[-1]):
                direction = torch.zeros_like(mask)
                direction[..., k] = 1.0
                (product,) = torch.autograd.grad((grad * direction).sum(), mask, retain_graph=True)
                curvature[..., k] -= product.detach().double() / num_samples  # column k of every row's block
            gradient += grad.detach().double() / num_samples
    if gradient is None:
        raise ValueError("no data points: the gradient and curvature of W's likelihood need at least one")
    return gradient, curvature
