"""
Tutorial: sparse codes on scikit-learn's 8x8 digits, with variational sparse
coding (``vsc``, spike-and-slab codes) and thresholded VSC (``tvsc``,
soft-thresholded Gaussian codes), and a classifier on the codes.

    python docs/tutorials/vsc_digits.py
"""

import numpy as np
from sklearn.linear_model import LogisticRegression

import pyro_sparse
from pyro_sparse import Optimization
from pyro_sparse.data.images import load_digits_images

# --- 1797 digits as rows of 64 pixels at unit norm, split 70/30.
digits = load_digits_images()
order = np.random.default_rng(0).permutation(len(digits.X))
train, test = order[:1257], order[1257:]
X_train, X_test, y_train, y_test = digits.X[train], digits.X[test], digits.y[train], digits.y[test]


def accuracy(codes_train, codes_test):
    """Softmax regression on the codes: how much of the label the codes keep."""
    classifier = LogisticRegression(max_iter=2000).fit(codes_train, y_train)
    return classifier.score(codes_test, y_test)


# --- VSC: z_k ~ alpha N(0, 1) + (1 - alpha) delta_0, one hidden layer of 200,
# the Gaussian likelihood with a decoder variance per pixel.  alpha = 0.1
# rather than the paper's 0.01: on 1257 digits and a few hundred steps the
# sparser prior leaves well under one active code per digit.  Spike
# pre-training: for 5 epochs only the spikes learn, then the slab is released
# over 5 more (guide options, passed like any other hyperparameter).
vsc = pyro_sparse.train(
    "vsc", X_train, latent_dim=20, alpha=0.1, hidden_dims=(200,), lr=1e-3, max_epochs=30, seed=0,
    pretrain_epochs=5, pretrain_ramp_epochs=5, progress=False,
)
codes = vsc.transform(X_test)  # posterior mode: exactly 0 where the spike is more probable
print(f"vsc: non-zero codes per digit {np.mean((codes != 0).sum(1)):.1f} of 20")
print("     spike probabilities of the first digit:", np.round(vsc.spike_probabilities(X_test[:1]), 2))
print(f"     accuracy from sparse mode codes {accuracy(vsc.transform(X_train), codes):.2f}, "
      f"from mean codes {accuracy(vsc.transform(X_train, kind='mean'), vsc.transform(X_test, kind='mean')):.2f}")
draws = vsc.sample_posterior(X_test[:5], num_samples=3)  # exact spike-and-slab draws, (3, 5, 20)
print("     exact zeros in posterior draws:", f"{np.mean(draws == 0):.0%}")
variations = vsc.conditional_samples(X_test[:2], num_samples=4)  # vary only the codes x switches on
print("     conditional samples:", variations.shape)

# --- Thresholded VSC: codes are Gaussian draws through a soft threshold,
# exactly zero where |draw| < lambda0 (lambda0 = 0.52, prior scale sqrt(0.1):
# about 10 % non-zero a priori).  amortized_threshold=False is Fallah & Rozell's guide, whose
# threshold is the prior's; the library's default lets the encoder set it per
# digit, and on digits it keeps most codes on (about 62 of 64 here).  The KL
# weight beta = 0.01 follows their training settings; at the ELBO's beta = 1
# the codes of so small a data set collapse to zero.  Max-ELBO sampling: J = 4
# draws per digit, the best one kept (their Eq. 9).
tvsc = pyro_sparse.train(
    "tvsc", X_train, latent_dim=64, latent_prior="thresholded_normal", amortized_threshold=False,
    beta=0.01, lr=1e-3, max_epochs=15, seed=0, progress=False,
    optimization=Optimization(num_particles=4, particle_reduction="max"),
)
codes = tvsc.transform(X_test)  # exactly sparse: 0 where P(z = 0) > 1/2
print(f"tvsc: non-zero codes per digit {np.mean((codes != 0).sum(1)):.1f} of 64, "
      f"accuracy {accuracy(tvsc.transform(X_train), codes):.2f}")

# --- the VAE with the same single hidden layer, for reference.
vae = pyro_sparse.train("vae", X_train, latent_dim=20, hidden_dims=(200,), noise="heteroscedastic", lr=1e-3,
                        max_epochs=30, seed=0, progress=False)
print(f"vae:  accuracy {accuracy(vae.transform(X_train), vae.transform(X_test)):.2f}")
# Heldout log-likelihoods (importance-weighted, per digit).  vsc and vae learn
# a noise variance per pixel; tvsc has a fixed one (half the mean pixel
# variance), so its number is on another scale and left out here.
print("heldout log-likelihood per digit: "
      f"vsc {vsc.heldout_log_likelihood(X_test, num_samples=20).mean():.1f}, "
      f"vae {vae.heldout_log_likelihood(X_test, num_samples=20).mean():.1f}")
