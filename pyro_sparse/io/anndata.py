"""
AnnData (the data container of scanpy and scvi-tools) in and out of
:func:`pyro_sparse.train` and :class:`~pyro_sparse.fitted.FittedModel`.

anndata is the optional ``anndata`` extra.  This module never imports it: an
AnnData object can only exist once its user has imported anndata, so it is
recognised through ``sys.modules`` and importing pyro_sparse stays light.
The matrix handed on is ``adata.X`` or a layer as stored, so a sparse
(CSR/CSC) matrix stays sparse and :meth:`pyro_sparse.data.Dataset.minibatches`
densifies it one minibatch at a time.
"""

import sys

from pyro_sparse.data import DataError, check_feature_names


def is_anndata(data):
    anndata = sys.modules.get("anndata")
    return anndata is not None and isinstance(data, anndata.AnnData)


def _matrix(adata, layer):
    if adata.isbacked:
        raise DataError(
            "the AnnData is in backed mode (its matrix is on disk); load it into memory with "
            "adata = adata.to_memory() first (a sparse matrix stays sparse)"
        )
    if layer is None:
        if adata.X is None:
            raise DataError(f"adata.X is empty; pass layer= naming one of adata.layers {list(adata.layers)}")
        return adata.X
    if layer not in adata.layers:
        raise DataError(f"adata.layers has no layer {layer!r} (it has {list(adata.layers)}); layer=None uses adata.X")
    return adata.layers[layer]


def training_data(data, layer=None):
    """
    ``(matrix, feature names)`` for :func:`~pyro_sparse.train`: for an AnnData,
    ``adata.X`` (or ``adata.layers[layer]``) and ``var_names``; anything else
    is returned as it is, with no names.
    """
    if not is_anndata(data):
        if layer is not None:
            raise ValueError(f"layer={layer!r} selects a layer of an AnnData, but data is a {type(data).__name__}")
        return data, None
    return _matrix(data, layer), [str(name) for name in data.var_names]


def evaluation_data(adata, config):
    """
    The matrix of an AnnData to evaluate a fitted model on: the layer the
    model was trained on, after checking that ``var_names`` are the training
    features in the training order.
    """
    check_feature_names(
        [str(name) for name in adata.var_names], config.get("feature_names"), "adata",
        selection="adata[:, fitted.config['feature_names']]",
    )
    return _matrix(adata, config.get("layer"))


def _optional(fitted, attribute):
    """A learned quantity the model may lack (its property raises AttributeError then)."""
    try:
        return getattr(fitted, attribute)
    except AttributeError:
        return None


def write_to(fitted, adata, key=None):
    """
    Store what ``fitted`` learned in ``adata`` (scanpy's conventions):
    ``obsm["X_<key>"]`` the codes of every cell (:meth:`~pyro_sparse.fitted.FittedModel.transform`),
    and, where the model has them, ``varm["W_<key>"]`` the (genes x factors)
    decoder mask W and ``varm["inclusion_probs_<key>"]`` E[γ_jk | w_jk, η_k],
    and ``uns["latent_correlation_<key>"]`` the (K, K) correlation matrix of
    a Gaussian prior of the codes.  ``key`` defaults to the model's name.
    """
    if not is_anndata(adata):
        raise TypeError(f"write_to needs an AnnData, got a {type(adata).__name__}")
    key = fitted.config["model"] if key is None else key
    adata.obsm[f"X_{key}"] = fitted.transform(adata)
    W = _optional(fitted, "W_")
    # oi_vae's W is (groups, K, p), not one loading per gene and factor.
    if W is not None and W.shape == (adata.n_vars, fitted.config["latent_dim"]):
        adata.varm[f"W_{key}"] = W
        inclusion_probs = _optional(fitted, "inclusion_probs_")
        if inclusion_probs is not None:
            adata.varm[f"inclusion_probs_{key}"] = inclusion_probs
    correlation = _optional(fitted, "latent_correlation_")
    if correlation is not None:
        adata.uns[f"latent_correlation_{key}"] = correlation
