"""A trained model and guide with numpy accessors: what ``train`` and ``load`` return."""

import numpy as np
import torch
from pyro import poutine

from pyro_sparse.checks import is_count, positive_number
from pyro_sparse.data import (
    DataError,
    Dataset,
    as_matrix,
    check_feature_names,
    check_units,
    check_values,
    feature_names_of,
)
from pyro_sparse.data.covariates import CovariateSpec
from pyro_sparse.infer.importance import (
    exact_guide_trace,
    expected_observation,
    forked_rng,
    importance_log_likelihood,
    local_latent_sites,
)
from pyro_sparse.infer.mask_posterior import mask_log_likelihood_curvature
from pyro_sparse.io import anndata as anndata_io
from pyro_sparse.io import serialization
from pyro_sparse.nn import check_precision, set_decoder_precision
from pyro_sparse.priors import SpikeSlabPrior


def evaluation_data(X, config, needs_library=True):
    """
    New data for a model trained with ``config``, as a :class:`~pyro_sparse.data.Dataset`:
    an AnnData's training layer, named features in the training order, the
    training feature count and values the likelihood accepts.  ``needs_library``:
    the caller scores or decodes the data, so a model trained with observed
    library sizes (``size_factor_key``) needs them (the encoder does not).
    """
    covariates = library = None
    name = "X"
    if anndata_io.is_anndata(X):
        X, covariates, library, name = anndata_io.evaluation_data(X, config, needs_library)
    elif config.get("covariates"):
        raise DataError("the model was trained with covariates from adata.obs: give it an AnnData with those columns")
    elif needs_library and (config.get("registration") or {}).get("size_factor_key"):
        key = config["registration"]["size_factor_key"]
        raise DataError(f"the model was trained with library sizes from adata.obs[{key!r}]: give it an AnnData "
                        "with that column")
    check_feature_names(feature_names_of(X), config.get("feature_names"))
    matrix = as_matrix(X, name=name)
    if matrix.shape[1] != config["num_features"]:
        raise DataError(f"{name} has {matrix.shape[1]} features but the model was trained on {config['num_features']}")
    check_values(matrix, config["likelihood"], name=name)
    return Dataset(matrix, config["likelihood"], config.get("feature_names"), config.get("layer"), covariates,
                   library)


def _check_num_samples(num_samples):
    if not is_count(num_samples):
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")


def feature_labels(names, num_features):
    """``names`` as a list, checked against the number of features; default: the indices."""
    labels = list(names) if names is not None else list(range(num_features))
    if len(labels) != num_features:
        raise ValueError(f"got {len(labels)} feature names for {num_features} features")
    return labels


def history_frame(history):
    """A fit's per-epoch ``train_loss`` and ``validation_loss`` (where recorded) as a DataFrame indexed by epoch."""
    import pandas as pd  # only this function needs pandas

    series = {k: history.get(k) for k in ("train_loss", "validation_loss")}
    return pd.DataFrame({k: v for k, v in series.items() if v}).rename_axis("epoch")


def loadings_table(W, names=None, inclusion=None):
    """
    ``W`` (features x factors) as a DataFrame of its non-zero entries:
    ``feature``, ``factor``, ``weight`` and, given ``inclusion`` (W's shape),
    ``inclusion_probability``; sorted by factor, then ``|W_jk|``.
    """
    import pandas as pd  # only this function needs pandas

    names = np.asarray(feature_labels(names, W.shape[0]))
    rows, factors = np.nonzero(W)
    table = pd.DataFrame({"feature": names[rows], "factor": factors, "weight": W[rows, factors]})
    if inclusion is not None:
        table["inclusion_probability"] = inclusion[rows, factors]
    order = np.lexsort((-np.abs(table["weight"].to_numpy()), table["factor"].to_numpy()))
    return table.iloc[order].reset_index(drop=True)


def top_features(W, k=5, names=None):
    """
    For each column of ``W`` (features x factors), the ``k`` features with the
    largest ``|W_jk|`` that are non-zero, named by ``names`` (default: indices).
    """
    if not is_count(k):
        raise ValueError(f"k must be a positive integer, got {k!r}")
    W = np.abs(W)
    if W.ndim != 2:
        raise AttributeError(f"top_features ranks the features of a (features x factors) W; this W has shape {W.shape}")
    names = feature_labels(names, W.shape[0])
    tops = []
    for column in W.T:
        order = [j for j in np.argsort(-column, kind="stable")[:k] if column[j] > 0]
        tops.append([names[j] for j in order])
    return tops


class FittedModel:
    """
    A trained model and guide with numpy accessors.  Learned quantities end in
    an underscore (scikit-learn style); ``W_`` and friends exist for models with
    a decoder mask.
    """

    def __init__(self, config, model, guide, history):
        self.config, self.model, self.guide, self.history_ = config, model, guide, history

    @property
    def device(self):
        return next(self.guide.parameters()).device

    @property
    def num_features(self):
        return self.config["num_features"]

    def _batches(self, X, batch_size=1024, needs_library=True):
        """The :class:`~pyro_sparse.data.dataset.Batch` objects of new data, checked against the training data."""
        data = evaluation_data(X, self.config, needs_library)
        if self.config["likelihood"] == "gaussian":
            check_units(data.matrix, self.guide.input_affine.loc.cpu(), self.guide.input_affine.scale.cpu())
        return data.minibatches(batch_size, device=self.device, shuffle=False)

    def _posterior(self, batch):
        return self.guide.posterior(batch.x, batch.covariates)

    @torch.no_grad()
    def transform(self, X, kind="mode"):
        """
        Codes of X, shape (N, K): ``kind="mode"`` the posterior mode per
        coordinate (for sparse-latent models exactly 0 where the spike is more
        probable than the slab), ``kind="mean"`` the posterior mean E_q[z | x]
        (with a learned threshold, of q(z | x, λ) at λ's posterior mean; draws of
        the marginal: :meth:`sample_posterior`).
        For Gaussian posteriors the two coincide.  Factors the decoder does not
        use (not in :attr:`active_factors_`: their column of W is exactly 0)
        read 0 whatever their posterior says: under a correlated prior that
        posterior merely copies the active codes.
        """
        if kind not in ("mode", "mean"):
            raise ValueError(f"kind must be 'mode' or 'mean', got {kind!r}")
        codes = np.concatenate(
            [getattr(self._posterior(batch), kind).cpu().numpy() for batch in self._batches(X, needs_library=False)]
        )
        inactive = np.setdiff1d(np.arange(codes.shape[1]), self.active_factors_)
        codes[:, inactive] = 0.0
        return codes

    @property
    def active_factors_(self):
        """
        Indices of the factors the decoder uses: those with a non-zero column
        of the decoder mask W (``ssl_dgm``; for ``oi_vae`` a non-zero column
        in any group), all K for models without a mask.  Not the columns of
        :attr:`support_`: a column whose entries all have E[γ_jk] < ½ can
        still carry weights of 0.4 and more that the decoder reads (docs: Results, synthetic).
        """
        if "W" not in self.guide.unconstrained:
            return np.arange(self.config["latent_dim"])
        W = np.abs(self.W_)
        return np.flatnonzero(W.sum(0) > 0 if W.ndim == 2 else W.sum((0, 2)) > 0)

    @property
    def support_(self):
        """
        The estimated support of the decoder mask, (G, K) boolean: the
        non-zero entries of W and, where the mask prior gives inclusion
        probabilities, only those with E[γ_jk] > ½ (the support the papers'
        F-score reads).
        """
        W = self.W_
        if W.ndim != 2:
            raise AttributeError(f"model {self.config['model']!r} has no (features x factors) decoder mask")
        support = W != 0
        try:
            support &= self.inclusion_probs_ > 0.5
        except AttributeError:  # a mask prior without inclusion probabilities (e.g. the horseshoe)
            pass
        return support

    def _gates(self, batch):
        posterior = self._posterior(batch).base_dist
        if not hasattr(posterior, "gate"):
            raise AttributeError(f"model {self.config['model']!r} has no spike-and-slab codes")
        return posterior.gate

    @torch.no_grad()
    def spike_probabilities(self, X):
        """
        For spike-and-slab codes, the probability γ_ij that code j of x_i is
        non-zero, (N, K): the encoder's, also for a factor the decoder does not
        use (see ``active_factors_``), whose code :meth:`transform` reads as 0.
        """
        return np.concatenate([self._gates(batch).cpu().numpy() for batch in self._batches(X, needs_library=False)])

    @torch.no_grad()
    def conditional_samples(self, X, num_samples=1):
        """
        Conditional generation of VSC (ICLR version Sec. 5.3): for each x, codes
        drawn from the prior slab N(0, 1) along only the dimensions the
        recognition model activates for x (γ > 0.5), zero elsewhere, decoded
        to E[x | z].  Shape (num_samples, N, G).  Defined for that prior, the
        spike-and-slab with an N(0, 1) slab (``latent_prior="spike_slab"``).
        """
        _check_num_samples(num_samples)
        if type(getattr(self.model, "latent_prior", None)) is not SpikeSlabPrior:
            raise AttributeError(f"conditional_samples draws from the N(0, 1) slab of VSC's spike-and-slab prior "
                                 f"(latent_prior='spike_slab'); model {self.config['model']!r} has another prior")
        samples = []
        for batch in self._batches(X):
            active = self._gates(batch) > 0.5
            draws = [
                expected_observation(self.model, self.guide, batch.x, torch.randn_like(active, dtype=batch.x.dtype)
                                     * active, **batch.kwargs)
                for _ in range(num_samples)
            ]
            samples.append(torch.stack(draws).cpu().numpy())
        return np.concatenate(samples, axis=1)

    @torch.no_grad()
    def sample_posterior(self, X, num_samples=1):
        """
        Draws z ~ q(z | x), shape (num_samples, N, K): z's marginal under the
        guide, so where q(z | x) depends on another local site (a learned
        threshold λ), each code comes with its own draw of λ.  A factor the
        decoder does not use (not in ``active_factors_``) is drawn from q all
        the same; it changes no data.
        """
        _check_num_samples(num_samples)
        samples = []
        for batch in self._batches(X, needs_library=False):
            with forked_rng(batch.x):
                order = local_latent_sites(poutine.trace(self.guide).get_trace(batch.x, **batch.kwargs))
            if order[0] == "z":  # nothing drawn before z: one vectorised draw
                draws = self._posterior(batch).sample((num_samples,))
            else:
                draws = torch.stack([exact_guide_trace(self.guide, batch.x, **batch.kwargs).nodes["z"]["value"]
                                     for _ in range(num_samples)])
            samples.append(draws.cpu().numpy())
        return np.concatenate(samples, axis=1)

    def reconstruct(self, X):
        """
        E[x | z = E_q[z | x]]: means (gaussian; expected counts for the count
        likelihoods, at each row's library size, or at exp E_q[log ℓ] for a
        latent one), probabilities (bernoulli, multinomial).
        """
        return np.concatenate([
            expected_observation(self.model, self.guide, batch.x, **batch.kwargs).cpu().numpy()
            for batch in self._batches(X)
        ])

    @torch.no_grad()
    def get_latent_library_size(self, X):
        """
        exp E_q[log ℓ_i | x_i], (N,): each cell's inferred library size (the
        posterior median) under ``library="latent"``.
        """
        if not getattr(self.guide, "latent_library", False):
            raise AttributeError(f"model {self.config['model']!r} was not trained with library='latent': its "
                                 "library sizes are the data's")
        return np.concatenate([self.guide.library_posterior(batch.x, batch.covariates).loc.exp().cpu().numpy()
                               for batch in self._batches(X, needs_library=False)])

    def get_latent_representation(self, X, kind="mean"):
        """scvi-tools' name for :meth:`transform`, posterior means by default: the codes of X, (N, K)."""
        return self.transform(X, kind=kind)

    @torch.no_grad()
    def get_normalized_expression(self, X, batch=None, library_size=1.0):
        """
        Denoised expression of X, (N, G): for the count likelihoods and the
        multinomial the decoder's proportions at E_q[z | x] (for ``zinb`` those
        of the negative binomial's mean, without the dropout gate, as scVI's) scaled to
        ``library_size`` per cell (1: they sum to 1), else E[x | z] as
        :meth:`reconstruct`.  ``batch`` decodes every
        cell as if it came from that batch (counterfactual, batch effect
        removed: the codes are still inferred from the cell's own batch, as
        scvi-tools' ``transform_batch``); it needs a model trained with a ``batch_key``.
        """
        proportions = self.model.observation.counts or self.config["likelihood"] == "multinomial"
        library_size = positive_number("library_size", library_size)  # the total each cell is scaled to
        if not proportions and library_size != 1.0:
            raise ValueError(f"library_size scales the proportions of the count and multinomial likelihoods; the "
                             f"{self.config['likelihood']} likelihood's expression is E[x | z] in the data's units: "
                             "leave library_size out")
        spec = CovariateSpec.from_config(self.config.get("covariates"))
        if batch is not None and spec is None:
            raise ValueError("batch= needs a model trained with a batch_key")
        pieces = []
        for piece in self._batches(X, needs_library=False):
            kwargs, decode_with = dict(piece.kwargs), {}
            if batch is not None:  # encoded as observed, decoded as if from `batch`
                decode_with["covariates"] = spec.with_batch(piece.covariates, batch)
            if self.model.observation.counts and not self.model.observation.latent_library:
                kwargs["library"] = piece.x.new_ones(piece.x.shape[0])  # the decoder's rates without the offset
            mean = expected_observation(self.model, self.guide, piece.x, decode_with=decode_with,
                                        zero_inflation=not proportions, **kwargs)
            pieces.append((mean / mean.sum(-1, keepdim=True) * library_size if proportions else mean).cpu().numpy())
        return np.concatenate(pieces)

    def loadings(self, names=None):
        """
        The decoder mask as a table (pandas DataFrame), one row per non-zero
        entry: ``feature`` (gene), ``factor``, ``weight`` W_jk and, for the SSL
        prior, ``inclusion_probability`` E[γ_jk]; sorted by factor, then ``|W_jk|``.
        """
        W = self.W_
        if W.ndim != 2:
            raise AttributeError(f"model {self.config['model']!r} has no features x factors mask")
        try:
            inclusion = self.inclusion_probs_
        except AttributeError:
            inclusion = None
        return loadings_table(W, names if names is not None else self.config.get("feature_names"), inclusion)

    def support_probability(self, X, num_samples=32):
        r"""
        P(\|w_jk\| > δ_jk | X), (G, K): the posterior probability that each
        entry of W lies where the slab of its Spike-and-Slab Lasso prior is
        the likelier component, i.e. that the support the fit reports
        (E[γ | w] > 1/2) holds there.  The likelihood of each row w_j, the
        rest of the fit held fixed, is approximated by a Gaussian
        (:func:`~pyro_sparse.infer.mask_posterior.mask_log_likelihood_curvature`
        on X, ``num_samples`` codes per data point); its marginal for w_jk
        (the row's other entries integrated out, their sparsity priors left
        aside, so that a factor correlated with k can stand in for it) is
        combined with the prior in closed form
        (:meth:`~pyro_sparse.distributions.SpikeSlabLasso.slab_region_probability`).
        E[γ | w] cannot fall below η λ1 / (η λ1 + (1 - η) λ0) at w = 0, so it
        cannot back a call at a low FDR; this probability can, as the data
        pin w_jk down.  It ignores the other parameters' uncertainty (its
        calibration on simulated data: docs, Results, single cell).  In a row
        whose likelihood is not locally concave in the factors in use, each
        entry uses its own curvature (the row's others held fixed), and an
        entry not locally concave keeps the prior's probability.  The
        curvature holds G K² float64 numbers.  Switched-off factors
        (``eta_ == 0``) read 0.  The codes are drawn with the fit's seed, so a
        call repeats (a loaded model gives the same answer) and leaves the
        caller's random stream alone; their Monte Carlo error moves entries
        near ½ (docs, Results, single cell), which more ``num_samples`` reduce.
        """
        _check_num_samples(num_samples)
        mask_prior = self._prior("W")
        prior = mask_prior.distribution().base_dist
        if not hasattr(prior, "slab_region_probability"):
            raise AttributeError(f"support_probability needs the Spike-and-Slab Lasso mask prior ('ssl' or "
                                 f"'gene_sets'), not {type(mask_prior).__name__}")
        if self.config["likelihood"] == "multinomial":
            raise ValueError("support_probability needs a likelihood that factorises over features; the "
                             "multinomial's softmax couples them")
        mask = self.guide.point_estimate("W").detach().double()
        with torch.random.fork_rng():  # every generator it seeds is put back, as the estimators' score does
            torch.manual_seed(self.config["training"]["seed"])
            gradient, curvature = mask_log_likelihood_curvature(
                self.model, self.guide, self._batches(X, batch_size=256), num_samples=num_samples
            )
        prior = type(prior)(*(getattr(prior, name).double() for name in ("eta", "lambda0", "lambda1")))
        on = torch.as_tensor(self.eta_ > 0, device=mask.device)
        # Where a row's block over the factors in use is not positive definite (a code that is 0 on all of X,
        # say), its entries fall back to their own curvature, the rest of the row held fixed.
        diagonal = torch.diagonal(curvature, dim1=-2, dim2=-1)
        concave = diagonal > 0
        safe = torch.where(concave, diagonal, torch.ones_like(diagonal))
        loc, scale = mask + gradient / safe, safe.rsqrt()
        # Each row's Gaussian over the factors in use: mean ŵ + H⁻¹g, marginal variances diag(H⁻¹).
        block = curvature[:, on][:, :, on]
        cholesky, info = torch.linalg.cholesky_ex((block + block.transpose(-1, -2)) / 2)
        definite = info == 0
        eye = torch.eye(block.shape[-1], dtype=block.dtype, device=block.device)
        covariance = torch.cholesky_inverse(torch.where(definite[:, None, None], cholesky, eye))
        marginal_loc = mask[:, on] + (covariance @ gradient[:, on, None]).squeeze(-1)
        marginal_scale = torch.diagonal(covariance, dim1=-2, dim2=-1).sqrt()
        loc[:, on] = torch.where(definite[:, None], marginal_loc, loc[:, on])
        scale[:, on] = torch.where(definite[:, None], marginal_scale, scale[:, on])
        concave[:, on] |= definite[:, None]
        posterior = prior.slab_region_probability(loc, scale)
        tail = 2 * prior.cdf(-prior.inclusion_threshold)  # the prior's P(|w| > δ)
        support = torch.where(concave, posterior, tail).cpu().numpy()
        return np.where(self.eta_ > 0, support, 0.0)

    def gene_set_changes(self, X, fdr=None, num_samples=32):
        """
        Genes the data move into or out of each gene set of
        ``mask_prior="gene_sets"``, as a pandas DataFrame with their E-step
        inclusion E[γ_jk] and the posterior probability of the set's support
        from :meth:`support_probability` on X (the training data, typically);
        ``fdr=α`` keeps the changes the Bayesian FDR rule calls at level α
        (:meth:`pyro_sparse.priors.GeneSetPrior.changes`).
        """
        prior = self._prior("W")
        if not hasattr(prior, "changes"):
            raise AttributeError(f"model {self.config['model']!r} was not trained with mask_prior='gene_sets'")
        return prior.changes(self.support_probability(X, num_samples), fdr)

    def heldout_log_likelihood(self, X, num_samples=100):
        """
        Importance-weighted estimate of log p(x_i) per data point (Burda et
        al. 2016).  For counts it conditions on the observed library size,
        or, under ``library="latent"``, integrates over it: compare only fits
        that treat the library alike.
        """
        _check_num_samples(num_samples)
        return np.concatenate(
            [
                importance_log_likelihood(self.model, self.guide, batch.x, num_samples, **batch.kwargs).cpu().numpy()
                for batch in self._batches(X, batch_size=256)
            ]
        )

    def to_arviz(self, X, num_samples=100, feature_names=None):
        """
        Posterior draws, posterior predictive replicates, element-wise
        log-likelihood and the data of X as ArviZ data (InferenceData, or a
        DataTree under arviz >= 1.0); see :func:`pyro_sparse.evaluation.diagnostics.to_arviz`.
        """
        # Imported here: arviz is slow to import and only these checks need it.
        from pyro_sparse.evaluation.diagnostics import to_arviz

        return to_arviz(self, X, num_samples=num_samples, feature_names=feature_names)

    def _point(self, name):
        if name not in self.guide.unconstrained:
            raise AttributeError(f"model {self.config['model']!r} has no global site {name!r}")
        return self.guide.point_estimate(name).detach().cpu().numpy()

    @property
    def W_(self):
        """
        The decoder mask W, (G, K); entries in the spike are exactly 0.  For
        ``oi_vae`` the group weights, (groups, K, p): ``W_[g, k]`` is column k
        of W^{(g)}.
        """
        return self._point("W")

    @property
    def dictionary_(self):
        """
        The dictionary A of a linear decoder (``decoder="linear"``: x ≈ A z), (G, K);
        column k is atom k (under ``shared_atom_norm``, the default, all share one norm).
        """
        if "A" not in self.guide.unconstrained:
            raise AttributeError(f"model {self.config['model']!r} has no linear dictionary (train it with "
                                 "decoder='linear')")
        return self._point("A")

    @property
    def latent_correlation_(self):
        """
        The correlation matrix R of the Gaussian prior of z, (K, K): learned
        (``latent_prior="correlated"``), from a fixed ``prior_covariance``, or I.
        """
        prior = self.model.latent_prior
        if not hasattr(prior, "learn_correlation"):
            raise AttributeError(f"model {self.config['model']!r} has no Gaussian prior of z with a correlation")
        scale_tril = self.guide.point_estimate(prior.site) if prior.learn_correlation else prior.scale_tril
        covariance = (scale_tril @ scale_tril.T).detach().cpu().double().numpy()
        scale = np.sqrt(np.diag(covariance))
        return covariance / np.outer(scale, scale)

    @property
    def sigma2_(self):
        """Per-feature noise variances (gaussian likelihood)."""
        return self._point("sigma2")

    @property
    def inclusion_probs_(self):
        """E[γ_jk | w_jk, η_k] (Eq. 57), (G, K); 0 in the columns of factors switched off (``eta_ == 0``)."""
        return np.where(self.eta_ > 0, self._prior("W").inclusion_probs.cpu().numpy(), 0.0)

    @property
    def eta_(self):
        """
        η_k, the share of features each factor is expected to use, (K,).  The
        E-step keeps η at float32's smallest normal number rather than 0 (its
        log must stay finite); a factor at that floor is switched off and reads 0.
        """
        prior = self._prior("W")
        if not hasattr(prior, "eta"):
            raise AttributeError(f"the {type(prior).__name__} of model {self.config['model']!r} has no η (the SSL "
                                 "prior's share of features per factor) and no inclusion probabilities")
        eta = prior.eta.cpu().numpy()
        return np.where(eta <= np.finfo(eta.dtype).tiny, 0.0, eta)

    def _prior(self, name):
        if name not in self.model.site_priors:
            raise AttributeError(f"model {self.config['model']!r} has no prior hooks for {name!r}")
        return self.model.site_priors[name]

    def top_features(self, k=5, names=None):
        """
        For each factor, the ``k`` features with the largest ``|W_jk|`` that are
        non-zero, named by ``names`` (default: an AnnData's ``var_names`` if
        the model was trained on one, else the feature indices).
        """
        return top_features(self.W_, k, names if names is not None else self.config.get("feature_names"))

    def write_to(self, adata, key=None):
        """
        Store the codes in ``adata.obsm["X_<key>"]`` and, where the model has
        them, W and its inclusion probabilities in ``adata.varm``; ``key``
        defaults to the model's name (see :func:`pyro_sparse.io.anndata.write_to`).
        """
        anndata_io.write_to(self, adata, key)

    def set_precision(self, precision):
        """
        Evaluate the decoder in ``"bf16"`` or ``"fp32"`` from now on and return
        this model.  After ``train`` and ``load`` the decoder runs in the
        precision of the fit (bfloat16 after a ``"bf16"`` fit, else float32),
        so evaluation sees the network that was trained; ``set_precision("fp32")``
        gives exact float32 evaluation.  Files keep the precision of the fit
        (``config["training"]["precision"]``), not this setting.
        """
        if precision not in ("fp32", "bf16"):
            raise ValueError(f"the decoder is evaluated in 'fp32' or 'bf16', got {precision!r} ('tf32' is for training)")
        set_decoder_precision(self.model, check_precision(precision, self.device))
        return self

    def history_frame(self):
        """
        The per-epoch series of ``history_`` as a pandas DataFrame indexed by
        epoch: the training loss (-ELBO per data point) and, when a validation
        set was held out, the validation loss.
        """
        return history_frame(self.history_)

    def save(self, path):
        """Write the model to ``path`` (tensors + JSON; see :mod:`pyro_sparse.io.serialization`)."""
        serialization.write(
            path,
            {**self.config, "history": self.history_},
            {"model": self.model.state_dict(), "guide": self.guide.state_dict()},
        )
