"""
AnnData (the data container of scanpy and scvi-tools) in and out of
:func:`pyro_sparse.train` and :class:`~pyro_sparse.fitted.FittedModel`.

anndata is the optional ``anndata`` extra.  This module imports it only in
:func:`read_backed`: an AnnData object can only exist once its user has
imported anndata, so it is recognised through ``sys.modules`` and importing
pyro_sparse stays light.  The matrix handed on is ``adata.X`` or a layer as
stored, so a sparse (CSR/CSC) matrix stays sparse and
:meth:`pyro_sparse.data.Dataset.minibatches` densifies it one minibatch at a
time; a CSR matrix on disk (a backed AnnData's X) stays on disk and is read in
blocks (:mod:`pyro_sparse.data.backed`).
"""

import os
import sys
import warnings

import numpy as np
import torch

from pyro_sparse.data import DataError, Dataset, check_feature_names
from pyro_sparse.data.backed import BackedMatrix, stored_on_disk
from pyro_sparse.data.covariates import CovariateSpec


def is_anndata(data):
    anndata = sys.modules.get("anndata")
    return anndata is not None and isinstance(data, anndata.AnnData)


def _matrix(adata, layer):
    """``adata.X`` or a layer; one stored on disk as a :class:`~pyro_sparse.data.backed.BackedMatrix`."""
    names = [name for name in adata.layers if name is not None]  # anndata >= 0.13 lists X as the layer None
    where = "adata.X" if layer is None else f"adata.layers[{layer!r}]"
    if layer is not None and layer not in names:
        raise DataError(f"adata.layers has no layer {layer!r} (it has {names}); layer=None uses adata.X")
    if layer is None and ("X" not in adata.file if adata.isbacked else adata.X is None):
        raise DataError(f"adata.X is empty; pass layer= naming one of adata.layers {names}")
    try:
        matrix = adata.X if layer is None else adata.layers[layer]
    except (OSError, KeyError) as error:  # h5py, opening the element of a backed file that is truncated or damaged
        if not adata.isbacked:
            raise
        try:
            state = f"{os.path.getsize(adata.filename)} bytes on disk"
        except OSError:
            state = "no longer readable"
        raise DataError(f"cannot read {where} of the backed file {str(adata.filename)!r} ({state}): {error}; "
                        "is it truncated or damaged? Write it again or copy it whole") from None
    if stored_on_disk(matrix):
        return BackedMatrix.of(matrix, where)
    if adata.isbacked and adata.is_view:
        warnings.warn(f"{where} of a view of the backed file {str(adata.filename)!r} is in memory: anndata reads a "
                      "view's matrix when it is accessed, so it is not trained on from disk; to train larger than "
                      "memory, write the subset to its own .h5ad file and open that backed", stacklevel=3)
    return matrix


def read_backed(path):
    """
    An AnnData of the ``.h5ad`` file ``path`` whose sparse X and layers stay
    on disk, to train on or evaluate larger than memory.  anndata's own
    ``read_h5ad(path, backed="r")`` leaves only X there and reads the layers
    (a ``layer="counts"``, say) into memory.  ``obs``, ``var``, ``obsm``,
    ``varm`` and ``uns`` are read into memory (``obsp``, ``varp`` and ``raw``
    are left out); the file stays open, read-only, while the AnnData lives.
    """
    import anndata
    import h5py

    from anndata.io import read_elem, sparse_dataset

    try:
        file = h5py.File(path, "r")
    except OSError as error:
        raise DataError(f"cannot open {str(path)!r} as an .h5ad file: {error}") from None

    def element(key):
        if file[key].attrs.get("encoding-type") in ("csr_matrix", "csc_matrix"):
            return sparse_dataset(file[key])
        size = getattr(file[key], "nbytes", None)  # a dense array; another encoding is a group
        warnings.warn(f"{key} of {str(path)!r} is not a sparse matrix, so it is read into memory"
                      + ("" if size is None else f" ({size / 2**20:.0f} MiB)")
                      + "; read_backed keeps CSR matrices on disk: to train larger than memory, write it as a "
                      "scipy.sparse.csr_matrix", stacklevel=3)
        return read_elem(file[key])

    parts = {key: read_elem(file[key]) for key in ("obs", "var", "obsm", "varm", "uns") if key in file}
    layers = {}
    for name in file.get("layers", {}):  # a loop, not a comprehension: the warning's stack level is read_backed's
        layers[name] = element(f"layers/{name}")
    return anndata.AnnData(X=element("X") if "X" in file else None, layers=layers, **parts)


REGISTRATION_KEY = "pyro_sparse"
_FIELDS = ("layer", "batch_key", "labels_key", "size_factor_key", "categorical_covariate_keys",
           "continuous_covariate_keys")


def setup_anndata(adata, layer=None, batch_key=None, labels_key=None, size_factor_key=None,
                  categorical_covariate_keys=(), continuous_covariate_keys=()):
    """
    Register which parts of ``adata`` a model uses, in ``adata.uns["pyro_sparse"]``
    (scvi-tools' convention): the ``layer`` of counts (``None``: ``adata.X``), the
    ``batch_key`` and other categorical and continuous ``adata.obs`` columns that
    enter encoder and decoder as covariates (not factors), a ``labels_key``
    (kept for evaluation, never used in training) and a ``size_factor_key``, an
    ``adata.obs`` column of library sizes for the count likelihoods (default:
    each cell's total count).  :func:`~pyro_sparse.train` and the fitted
    model's methods read the registration.
    """
    if not is_anndata(adata):
        raise TypeError(f"setup_anndata needs an AnnData, got a {type(adata).__name__}")
    for name, keys in (("categorical_covariate_keys", categorical_covariate_keys),
                       ("continuous_covariate_keys", continuous_covariate_keys)):
        if isinstance(keys, str):  # a string would be read as its letters
            raise TypeError(f"{name} is a list of adata.obs columns: write {name}=[{keys!r}]")
    registration = {"layer": layer, "batch_key": batch_key, "labels_key": labels_key,
                    "size_factor_key": size_factor_key,
                    "categorical_covariate_keys": list(categorical_covariate_keys),
                    "continuous_covariate_keys": list(continuous_covariate_keys)}
    _matrix(adata, layer)
    for key in [batch_key, labels_key, size_factor_key, *categorical_covariate_keys, *continuous_covariate_keys]:
        if key is not None and key not in adata.obs:
            raise DataError(f"adata.obs has no column {key!r} (it has {list(adata.obs.columns)})")
    adata.uns[REGISTRATION_KEY] = registration
    return registration


def registration_of(adata, layer=None, batch_key=None):
    """``adata``'s registration (:func:`setup_anndata`), with ``layer`` and ``batch_key`` given to ``train`` on top."""
    registration = dict(adata.uns.get(REGISTRATION_KEY, {}))
    registration = {field: registration.get(field) for field in _FIELDS}
    for field in ("categorical_covariate_keys", "continuous_covariate_keys"):
        # An .h5ad file gives the key lists back as numpy arrays (float64 when empty).
        registration[field] = [str(key) for key in np.atleast_1d(registration[field] if registration[field]
                                                                   is not None else [])]
    for field, value in (("layer", layer), ("batch_key", batch_key)):
        if value is not None:
            registration[field] = value
    return registration


def _library(adata, key):
    if key is None:
        return None
    if key not in adata.obs:
        raise DataError(f"adata.obs has no column {key!r}, the library sizes the model was trained with "
                        f"(it has {list(adata.obs.columns)})")
    values = np.asarray(adata.obs[key], dtype=np.float64)
    if not (np.all(np.isfinite(values)) and np.all(values > 0)):
        raise DataError(f"adata.obs[{key!r}] (the library sizes) must be positive and finite")
    return torch.as_tensor(values, dtype=torch.float32)


def location(layer):
    """Where an AnnData's values are, for messages: ``adata.X`` or ``adata.layers['counts']``."""
    return "adata.X" if layer is None else f"adata.layers[{layer!r}]"


def training_dataset(data, likelihood, layer=None, batch_key=None):
    """
    The :class:`~pyro_sparse.data.Dataset` ``train`` fits: for an AnnData,
    its registered layer, ``var_names``, covariates and library sizes; other
    data as they are (``layer`` and ``batch_key`` apply to AnnData only).
    """
    if not is_anndata(data):
        for name, value in (("layer", layer), ("batch_key", batch_key)):
            if value is not None:
                raise ValueError(f"{name}={value!r} selects part of an AnnData, but data is a {type(data).__name__}")
        return Dataset.from_data(data, likelihood)
    registration = registration_of(data, layer, batch_key)
    spec = None
    if registration["batch_key"] or registration["categorical_covariate_keys"] or registration[
            "continuous_covariate_keys"]:
        spec = CovariateSpec.fit(data.obs, registration["batch_key"], registration["categorical_covariate_keys"] or (),
                                 registration["continuous_covariate_keys"] or ())
    dataset = Dataset.from_data(
        _matrix(data, registration["layer"]), likelihood, [str(name) for name in data.var_names],
        layer=registration["layer"], name=location(registration["layer"]),
        covariates=None if spec is None else spec.encode(data.obs), spec=spec,
        library=_library(data, registration["size_factor_key"]),
    )
    dataset.registration = registration
    return dataset


def evaluation_data(adata, config, needs_library=True):
    """
    ``(matrix, covariates, library, name)`` of an AnnData to evaluate a fitted model
    on: the layer the model was trained on (after checking that ``var_names``
    are the training features in the training order), its covariates encoded
    as in training, and its library sizes (``None`` unless ``needs_library``:
    the encoder does not read them); ``name`` says where the values are, for messages.
    """
    check_feature_names(
        [str(name) for name in adata.var_names], config.get("feature_names"), "adata",
        selection="adata[:, fitted.config['feature_names']]",
    )
    registration = config.get("registration") or {"layer": config.get("layer")}
    spec = CovariateSpec.from_config(config.get("covariates"))
    covariates = None if spec is None else spec.encode(adata.obs)
    library = _library(adata, registration.get("size_factor_key")) if needs_library else None
    return _matrix(adata, registration.get("layer")), covariates, library, location(registration.get("layer"))


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
    Entries of an earlier fit written under the same key that this model
    does not have are removed, so every ``<key>`` entry is this fit's.
    """
    if not is_anndata(adata):
        raise TypeError(f"write_to needs an AnnData, got a {type(adata).__name__}")
    key = fitted.config["model"] if key is None else key
    adata.obsm[f"X_{key}"] = fitted.transform(adata)
    W = _optional(fitted, "W_")
    # oi_vae's W is (groups, K, p), not one loading per gene and factor.
    if W is not None and W.shape != (adata.n_vars, fitted.config["latent_dim"]):
        W = None
    entries = [(adata.varm, f"W_{key}", W),
               (adata.varm, f"inclusion_probs_{key}", None if W is None else _optional(fitted, "inclusion_probs_")),
               (adata.uns, f"latent_correlation_{key}", _optional(fitted, "latent_correlation_"))]
    for store, name, value in entries:
        if value is not None:
            store[name] = value
        elif name in store:
            del store[name]
