"""
Covariates: columns of a cell table (``adata.obs``) that enter the encoder and
the decoder but are not factors.  Categorical columns (batch, donor) become
one-hot blocks, the batch first; continuous columns are standardised with
the training data's mean and standard deviation.  The encoding is fixed at
training and saved with the model, so new data are encoded alike and a
category the model never saw is an error.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from pyro_sparse.data.validation import DataError

# A continuous covariate enters the networks linearly (and the count decoders' rates through exp), so a value
# far outside its training spread, e.g. an age in days where training had years, gives absurd or infinite
# outputs.  Training values lie within √(N - 1) sds of their mean (Samuelson's inequality), below 1e3 for
# N ≤ 10^6 cells; new values beyond it are refused.
MAX_COVARIATE_SDS = 1e3


def _column(table, key, name):
    if key not in table:
        raise DataError(f"{name} has no column {key!r} (it has {list(table.columns)})")
    return table[key]


def _categories_of(table, key, name):
    """A categorical column's values; a missing value would otherwise become a category named 'nan'."""
    values = _column(table, key, name)
    missing = int(values.isna().sum())
    if missing:
        raise DataError(f"{name}[{key!r}] has {missing} missing values; fill them (e.g. with a category 'unknown') "
                        "or drop those rows")
    return values


def _labels(values):
    """
    A categorical column's values as the text its encoding compares, one form
    for training and new data (``str`` of a value pandas hands out as a Python
    float or Timestamp differs from numpy's text of the column's own dtype).
    """
    return np.asarray(values).astype(str)


@dataclass
class CovariateSpec:
    """
    The covariate layout: ``categorical`` maps each categorical key to its
    categories in training order (the ``batch_key``'s block comes first),
    ``continuous`` each continuous key to its training (mean, sd).
    """

    categorical: dict = field(default_factory=dict)
    continuous: dict = field(default_factory=dict)
    batch_key: str = None

    @classmethod
    def fit(cls, table, batch_key=None, categorical_keys=(), continuous_keys=(), name="adata.obs"):
        """The layout of ``table``'s columns (a pandas DataFrame such as ``adata.obs``)."""
        keys = ([batch_key] if batch_key is not None else []) + [k for k in categorical_keys if k != batch_key]
        both = sorted(set(keys) & set(continuous_keys), key=str)
        if both:
            raise DataError(f"{name} columns {both} are registered both as categorical (or the batch key) and as "
                            "continuous covariates: give each column one kind")
        categorical = {}
        for key in keys:
            values = _categories_of(table, key, name)
            try:
                # A categorical dtype's unused categories are not categories of the data: their
                # one-hot weights would never be trained, so a cell of one is refused as unseen.
                labels = (_labels(values.cat.remove_unused_categories().cat.categories) if hasattr(values, "cat")
                          else _labels(values)[np.argsort(np.asarray(values), kind="stable")])
            except TypeError:
                raise DataError(f"{name}[{key!r}] mixes types (e.g. numbers and strings); give it one type") from None
            categorical[key] = list(dict.fromkeys(labels.tolist()))
        continuous = {}
        for key in continuous_keys:
            values = _numbers(table, key, name)
            continuous[key] = (float(values.mean()), float(values.std()) or 1.0)
        return cls(categorical, continuous, batch_key)

    @property
    def width(self):
        """C, the length of a data point's covariate vector."""
        return sum(len(categories) for categories in self.categorical.values()) + len(self.continuous)

    @property
    def num_batches(self):
        """Categories of the batch key (1 without one): the first ``num_batches`` covariates are its one-hot."""
        return len(self.categorical[self.batch_key]) if self.batch_key is not None else 1

    def encode(self, table, name="adata.obs"):
        """The (N, C) float32 covariates of ``table``'s rows."""
        blocks = []
        for key, categories in self.categorical.items():
            values = _labels(_categories_of(table, key, name))
            index = {category: i for i, category in enumerate(categories)}
            unseen = sorted(str(value) for value in set(values) - set(index))
            if unseen:
                raise DataError(
                    f"{name}[{key!r}] has categories the model was not trained on: {unseen[:5]} "
                    f"(it knows {categories[:10]}; categories are compared as text, so 1 and 1.0 differ)"
                )
            blocks.append(np.eye(len(categories), dtype=np.float32)[[index[v] for v in values]])
        for key, (mean, sd) in self.continuous.items():
            values = _numbers(table, key, name)
            standardized = (values - mean) / sd
            far = np.abs(standardized) > MAX_COVARIATE_SDS
            if far.any():
                raise DataError(
                    f"{name}[{key!r}] has values more than {MAX_COVARIATE_SDS:.0e} training sds from the "
                    f"training mean (e.g. {values[far][0]:.4g}; training mean {mean:.4g}, sd {sd:.4g}): "
                    "check the column's units"
                )
            blocks.append(standardized.astype(np.float32)[:, None])
        return torch.as_tensor(np.concatenate(blocks, axis=1))

    def with_batch(self, covariates, batch):
        """``covariates`` with every row's batch set to ``batch`` (counterfactual decoding)."""
        if self.batch_key is None:
            raise ValueError("the model was trained without a batch_key: there is no batch to set")
        categories = self.categorical[self.batch_key]
        if str(batch) not in categories:
            raise DataError(f"batch {batch!r} is not one of the training batches {categories}")
        covariates = covariates.clone()
        covariates[:, : len(categories)] = 0.0
        covariates[:, categories.index(str(batch))] = 1.0
        return covariates

    def to_config(self):
        """The layout as JSON: ordered lists of [key, ...] pairs, since the column order is the encoding."""
        return {"categorical": [[key, categories] for key, categories in self.categorical.items()],
                "continuous": [[key, mean, sd] for key, (mean, sd) in self.continuous.items()],
                "batch_key": self.batch_key}

    @classmethod
    def from_config(cls, config):
        if config is None:
            return None
        categorical, continuous, batch_key = config["categorical"], config["continuous"], config["batch_key"]
        if isinstance(categorical, dict):
            # Written as dicts by earlier versions, whose files sorted the keys: the training order is
            # recoverable only where it is unambiguous (the batch block first, at most one other key of a kind).
            others = [key for key in categorical if key != batch_key]
            if len(others) > 1 or len(continuous) > 1:
                raise DataError(
                    "this model file was written by an earlier pyro_sparse that did not keep the order of its "
                    f"covariates ({others + list(continuous)}), so new data cannot be encoded as in training; "
                    "refit the model"
                )
            keys = ([batch_key] if batch_key is not None else []) + others
            return cls({key: categorical[key] for key in keys}, {k: tuple(v) for k, v in continuous.items()},
                       batch_key)
        return cls({key: list(categories) for key, categories in categorical},
                   {key: (mean, sd) for key, mean, sd in continuous}, batch_key)


def _numbers(table, key, name):
    """A continuous covariate's values as float64, checked: numbers, all finite."""
    column = _column(table, key, name)
    try:
        values = np.asarray(column, dtype=np.float64)
    except (TypeError, ValueError):
        raise DataError(f"{name}[{key!r}] is a continuous covariate but has values that are not numbers") from None
    if not np.all(np.isfinite(values)):
        raise DataError(f"{name}[{key!r}] has NaN or infinite values")
    return values
