"""
Non-negative matrix factorisation (scikit-learn's NMF) with the evaluation
interface of :class:`~pyro_sparse.fitted.FittedModel`, registered as ``nmf``.
It is fitted by its own routine, not by SVI.
"""

import numpy as np
import scipy.sparse as sp
import torch
from scipy.special import gammaln, xlogy
from sklearn.decomposition import NMF as SklearnNMF
from sklearn.decomposition import non_negative_factorization

from pyro_sparse.data import DataError, DataSummary
from pyro_sparse.data.validation import OnDisk
from pyro_sparse.fitted import evaluation_data, history_frame, loadings_table, top_features
from pyro_sparse.infer.config import unknown_options_error
from pyro_sparse.io import anndata as anndata_io
from pyro_sparse.io import serialization

# The sklearn objective that is the likelihood's negative log, up to constants.
_LOSSES = {
    "gaussian": {"beta_loss": "frobenius", "solver": "cd"},
    "multinomial": {"beta_loss": "kullback-leibler", "solver": "mu"},
}


def _check_likelihood(likelihood):
    if likelihood not in _LOSSES:
        raise ValueError(
            f"nmf supports the likelihoods {sorted(_LOSSES)}, got {likelihood!r}; fit "
            + ("binary data" if likelihood == "bernoulli" else "counts")
            + " with likelihood='multinomial' (the Kullback-Leibler loss: Poisson maximum likelihood)"
        )


def _as_float64(matrix):
    return matrix.astype(np.float64) if sp.issparse(matrix) else matrix.numpy().astype(np.float64)


def _check_nonnegative(matrix, name):
    if isinstance(matrix, OnDisk):
        raise DataError(f"{name} is on disk (a backed AnnData); nmf fits in memory: load it with adata.to_memory()")
    values = matrix.data if sp.issparse(matrix) else matrix
    if values.size and values.min() < 0:
        raise DataError(f"{name} has negative values; NMF needs non-negative data (shift or clip it first)")


class FittedNMF:
    r"""
    X ≈ codes · components with both factors non-negative (scikit-learn's
    :class:`~sklearn.decomposition.NMF`), as a probabilistic model:

    * ``likelihood="multinomial"`` (counts): fitted by the Kullback-Leibler
      loss, which is maximum likelihood for x_ij ~ Poisson((WH)_ij).
      :meth:`heldout_log_likelihood` is that Poisson likelihood *given each
      row's total*, log Multinomial(x_i | n_i, π_i) with
      π_i = (w_i H) / Σ_j (w_i H)_j: the quantity the multinomial likelihood
      of the deep models scores, so the numbers are comparable (the total
      count's own Poisson term, which they do not model, is left out).
      Rates are floored at 1e-10 of the row's mean rate, so a count on a
      feature the factors give no mass stays finite.
    * ``likelihood="gaussian"`` (non-negative real data): fitted by the
      Frobenius loss, maximum likelihood for x_ij ~ N((WH)_ij, σ²); the
      heldout likelihood uses per-feature variances σ_j², the mean squared
      training residual of feature j (floored at 1e-3 of the mean feature
      variance, as the VAE's heteroscedastic decoder).

    A new row's code is fitted to that row with the components held fixed
    (the same loss and penalty; :meth:`transform`), so the heldout
    likelihood is a plug-in value at the row's best code: optimistic next to
    the marginal likelihood p(x) the deep models estimate.

    ``alpha`` is the penalty of scikit-learn's NMF before version 1.0 (used by
    Moran et al. 2022, Appendix C.3: ``alpha=1.0``): ``alpha·(l1_ratio·(‖W‖₁ + ‖H‖₁) +
    ½(1 - l1_ratio)(‖W‖² + ‖H‖²))`` added to the loss; current
    scikit-learn scales its ``alpha_W``/``alpha_H`` by the numbers of features
    and data points, which this class undoes.

    ``W_`` is the (G, K) matrix of components, features by factors, like the
    sparse VAE's mask.
    """

    def __init__(self, config, components, noise_variance, history):
        self.config, self.history_ = config, history
        self.components = components  # (K, G)
        self.noise_variance = noise_variance  # (G,), gaussian only

    @classmethod
    def fit(cls, matrix, *, latent_dim, likelihood, seed, alpha=1.0, l1_ratio=0.0, max_iter=1000, tol=1e-4):
        """
        Fit to ``matrix`` (a CPU float32 tensor or CSR matrix, as a
        :class:`~pyro_sparse.data.Dataset` holds it).
        """
        _check_likelihood(likelihood)
        if not alpha >= 0:
            raise ValueError(f"alpha must be non-negative, got {alpha}")
        if not 0 <= l1_ratio <= 1:
            raise ValueError(f"l1_ratio must be in [0, 1], got {l1_ratio}")
        _check_nonnegative(matrix, "data")
        num_data, num_features = matrix.shape
        config = {
            "model": "nmf",
            "num_features": num_features,
            "latent_dim": int(latent_dim),
            "likelihood": likelihood,
            "num_data": num_data,
            "feature_variances_mean": float(np.mean(DataSummary.of(matrix).feature_variances)),
            "hyperparameters": {"alpha": float(alpha), "l1_ratio": float(l1_ratio), "max_iter": int(max_iter), "tol": float(tol)},
            "training": {"seed": int(seed)},
        }
        estimator = SklearnNMF(
            n_components=int(latent_dim),
            random_state=seed,
            alpha_W=alpha / num_features,
            alpha_H=alpha / num_data,
            l1_ratio=l1_ratio,
            max_iter=max_iter,
            tol=tol,
            **_LOSSES[likelihood],
        )
        X = _as_float64(matrix)
        codes = estimator.fit_transform(X)
        fitted = cls(config, estimator.components_, None, {})
        if likelihood == "gaussian":
            fitted.noise_variance = fitted._residual_variance(X, codes)
        fitted.history_ = {
            "train_loss": [-float(np.mean(fitted._log_likelihood(X, codes)))],
            "iterations": int(estimator.n_iter_),
        }
        return fitted

    @classmethod
    def from_saved(cls, config, states, history):
        """Rebuild from a model file's configuration and tensors (see :meth:`save`)."""
        state = states["nmf"]
        noise_variance = state["noise_variance"].numpy() if "noise_variance" in state else None
        components = state["components"].numpy()
        if components.shape != (config["latent_dim"], config["num_features"]):
            raise ValueError(f"components have shape {components.shape}, expected (latent_dim, num_features)")
        return cls(config, components, noise_variance, history)

    def save(self, path):
        """Write the model to ``path`` (tensors + JSON; see :mod:`pyro_sparse.io.serialization`)."""
        state = {"components": torch.from_numpy(self.components)}
        if self.noise_variance is not None:
            state["noise_variance"] = torch.from_numpy(self.noise_variance)
        serialization.write(path, {**self.config, "history": self.history_}, {"nmf": state})

    @property
    def num_features(self):
        return self.config["num_features"]

    @property
    def W_(self):
        """The components as a (G, K) matrix: feature j's loading on factor k."""
        return self.components.T.copy()

    def top_features(self, k=5, names=None):
        """For each factor, the ``k`` features with the largest loadings that are non-zero."""
        return top_features(self.W_, k, names if names is not None else self.config.get("feature_names"))

    def loadings(self, names=None):
        """W as a table (pandas DataFrame): one row per non-zero loading, ``feature``, ``factor``, ``weight``."""
        return loadings_table(self.W_, names if names is not None else self.config.get("feature_names"))

    def history_frame(self):
        """The fit's training loss (scikit-learn's final reconstruction error) as a DataFrame indexed by epoch."""
        return history_frame(self.history_)

    def write_to(self, adata, key=None):
        """Store the codes in ``adata.obsm["X_<key>"]`` and W in ``adata.varm["W_<key>"]`` (key: ``"nmf"``)."""
        anndata_io.write_to(self, adata, key)

    def _check(self, X):
        matrix = evaluation_data(X, self.config).matrix
        _check_nonnegative(matrix, "X")
        return _as_float64(matrix)

    def _codes(self, X):
        hyper = self.config["hyperparameters"]
        codes, _, _ = non_negative_factorization(
            X,
            H=self.components,
            n_components=self.config["latent_dim"],
            update_H=False,
            alpha_W=hyper["alpha"] / self.num_features,
            l1_ratio=hyper["l1_ratio"],
            max_iter=hyper["max_iter"],
            tol=hyper["tol"],
            **_LOSSES[self.config["likelihood"]],
        )
        return codes

    def transform(self, X, kind="mode"):
        """
        Codes of X, (N, K): each row's code fitted with the components fixed.
        They are point estimates, so ``kind="mode"`` and ``"mean"`` agree.
        """
        if kind not in ("mode", "mean"):
            raise ValueError(f"kind must be 'mode' or 'mean', got {kind!r}")
        return self._codes(self._check(X))

    def _rates(self, codes):
        rates = codes @ self.components
        if self.config["likelihood"] == "multinomial":
            floor = 1e-10 * rates.mean(1, keepdims=True)
            rates = np.maximum(rates, np.where(floor > 0, floor, 1.0))
            rates = rates / rates.sum(1, keepdims=True)
        return rates

    def reconstruct(self, X):
        """Means (gaussian) or feature probabilities (multinomial) at each row's code."""
        return self._rates(self.transform(X))

    def _residual_variance(self, X, codes):
        residual = (X.toarray() if sp.issparse(X) else X) - codes @ self.components
        floor = 1e-3 * self.config["feature_variances_mean"]
        return np.maximum(np.mean(residual**2, axis=0), floor)

    def _log_likelihood(self, X, codes):
        X = X.toarray() if sp.issparse(X) else X
        rates = self._rates(codes)
        if self.config["likelihood"] == "gaussian":
            variance = self.noise_variance
            return -0.5 * np.sum((X - rates) ** 2 / variance + np.log(2 * np.pi * variance), axis=1)
        totals = X.sum(1)
        return gammaln(totals + 1) - gammaln(X + 1).sum(1) + xlogy(X, rates).sum(1)

    def heldout_log_likelihood(self, X, num_samples=None):
        """
        log p(x_i) per row at the row's fitted code (see the class notes for
        the likelihood).  ``num_samples`` is accepted for the interface of
        :meth:`~pyro_sparse.fitted.FittedModel.heldout_log_likelihood` and unused: given its code
        a row's likelihood is exact.
        """
        X = self._check(X)
        return self._log_likelihood(X, self._codes(X))


class NMF:
    """The registry entry of ``nmf``: fitted by scikit-learn, evaluated like the SVI models."""

    summary = "non-negative matrix factorisation (scikit-learn), Poisson (KL) or Gaussian (Frobenius) loss"
    likelihoods = tuple(_LOSSES)
    _OPTIONS = ("alpha", "l1_ratio", "max_iter", "tol")

    def check_likelihood(self, likelihood):
        """A ValueError, with what to fit instead, for a likelihood NMF has no loss for."""
        _check_likelihood(likelihood)

    def option_names(self, latent_prior=None, mask_prior=None):
        """The hyperparameters ``train("nmf", ...)`` accepts (priors do not apply)."""
        return list(self._OPTIONS)

    def fit(self, name, dataset, latent_dim, settings, hyper, keywords=()):
        """
        Fit to a validated :class:`~pyro_sparse.data.Dataset`; of the training
        settings only ``seed`` applies.  ``keywords``: as for SVIModel.fit.
        """
        unknown = sorted(set(hyper) - set(self._OPTIONS))
        if unknown:
            raise unknown_options_error(name, unknown, list(self._OPTIONS), keywords)
        policy = settings.checkpointing
        if policy.path is not None or policy.resume_from is not None:
            raise ValueError(f"model {name!r} is fitted by scikit-learn in one call: it writes no checkpoint and "
                             "resumes none (Checkpointing path / resume_from); save the fitted model with .save(path)")
        if dataset.covariates is not None or dataset.library is not None:
            raise ValueError(f"model {name!r} takes no covariates or library sizes (batch_key, covariate or "
                             "size_factor keys of the AnnData registration); fit an SVI model such as 'vae' for them")
        fitted = FittedNMF.fit(dataset.matrix, latent_dim=latent_dim, likelihood=dataset.likelihood,
                               seed=settings.seed, **hyper)
        fitted.config.update(feature_names=dataset.feature_names, layer=dataset.layer)
        return fitted

    def load(self, path, config, states, history, device, priors):
        """A FittedNMF from a model file (``device`` does not apply: it computes with numpy)."""
        given = [name for name, value in priors.items() if value is not None]
        if given:
            raise ValueError(f"{path!r} was not trained with a user-defined {given[0]}; load it without {given[0]}=")
        try:
            return FittedNMF.from_saved(config, states, history)
        except (KeyError, TypeError, ValueError) as error:
            raise serialization.ModelFileError(f"{path!r} does not match the model it describes: {error}") from None
