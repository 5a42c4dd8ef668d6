"""
Tutorial: the sparse VAE on the synthetic data of Moran et al. (2022), Eq. 9.

Seven features made from two factors, each feature using one or both of them;
we fit five factors and let the Spike-and-Slab Lasso prior on the decoder
mask W find out which are needed and which feature uses which.  Then the same
data with a VAE, scored on fresh data by the same metrics.

    python docs/tutorials/sparse_vae_synthetic.py
"""

import numpy as np

import pyro_sparse
from pyro_sparse import evaluation
from pyro_sparse.data.synthetic import synthetic_sparse_dgm

# --- the data: N = 1000 points of Eq. 9 with uncorrelated factors (rho = 0),
# and 500 fresh points from the same model to score on.
train = synthetic_sparse_dgm(n=1000, rho=0.0, seed=0)
test = synthetic_sparse_dgm(n=500, rho=0.0, seed=1)
print("X:", train.X.shape, " true factors:", train.z.shape, " true support of W:", train.support.shape)
print(train.support.astype(int))  # features x true factors: 1 where feature j uses factor k

# --- the sparse VAE: K = 5 factors (three too many), the paper's Table 6
# network and SSL rates; 100 epochs instead of the paper's 200 to stay quick.
settings = dict(latent_dim=5, max_epochs=100, batch_size=100, lr=0.01, seed=0, progress=False)
sparse = pyro_sparse.train("ssl_dgm", train.X, hidden_dims=(50, 50, 50), lambda0=10.0, lambda1=1.0, **settings)

np.set_printoptions(precision=2, suppress=True)
print("W (features x factors), exact zeros where a feature does not use a factor:")
print(sparse.W_)
print("eta, the share of features each factor uses:", sparse.eta_)
print("factors in use:", len(sparse.active_factors_), "of", sparse.W_.shape[1])

# --- the VAE baseline: the same network, likelihood and training settings.
dense = pyro_sparse.train("vae", train.X, hidden_dims=(50, 50, 50), **settings)

# --- scores on the fresh points: heldout NLL (importance-weighted, per point),
# MSE of the reconstruction E[x | E_q z], DCI disentanglement against the true
# factors, and (sparse VAE only) the F-score of W's support against the truth.
for name, fitted in [("sparse VAE", sparse), ("VAE", dense)]:
    z = fitted.transform(test.X)
    line = (
        f"{name:>10}: NLL {evaluation.heldout_nll(fitted.heldout_log_likelihood(test.X, num_samples=50)):.2f}"
        f"  MSE {evaluation.mse(test.X, fitted.reconstruct(test.X)):.2f}"
        f"  DCI {evaluation.dci_disentanglement(z, test.z):.2f}"
    )
    if fitted is sparse:
        matching = evaluation.match_factors(z, test.z)  # which fitted factor is which true one
        line += f"  support F-score {evaluation.support_f_score(sparse.W_, test.support, matching):.2f}"
    print(line)

# --- the loss curve, and the model as a file (tensors + JSON, never pickled code).
print(sparse.history_frame().tail(3))
sparse.save("sparse_vae.pt")
again = pyro_sparse.load("sparse_vae.pt")
assert np.allclose(again.transform(test.X), sparse.transform(test.X))
