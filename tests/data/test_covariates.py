"""Covariates from a cell table: one-hot batches first, standardised continuous columns, unseen categories refused."""

import numpy as np
import pytest
import torch

from pyro_sparse.data import DataError
from pyro_sparse.data.covariates import CovariateSpec

pandas = pytest.importorskip("pandas")


@pytest.fixture
def obs():
    return pandas.DataFrame({
        "batch": pandas.Categorical(["b", "a", "b", "c"]),
        "donor": ["d1", "d2", "d1", "d1"],
        "percent_mito": [0.1, 0.3, 0.2, 0.4],
    })


def test_layout_and_encoding(obs):
    spec = CovariateSpec.fit(obs, batch_key="batch", categorical_keys=["donor"], continuous_keys=["percent_mito"])
    assert spec.width == 3 + 2 + 1 and spec.num_batches == 3
    encoded = spec.encode(obs)
    np.testing.assert_array_equal(encoded[:, :3].numpy(), [[0, 1, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]])
    np.testing.assert_array_equal(encoded[:, 3:5].numpy(), [[1, 0], [0, 1], [1, 0], [1, 0]])
    mito = encoded[:, 5].numpy()
    assert mito.mean() == pytest.approx(0.0, abs=1e-6) and mito.std() == pytest.approx(1.0, abs=1e-6)


def test_new_data_are_encoded_with_the_training_layout(obs):
    spec = CovariateSpec.fit(obs, batch_key="batch", continuous_keys=["percent_mito"])
    restored = CovariateSpec.from_config(spec.to_config())
    new = obs.iloc[[3, 0]].reset_index(drop=True)
    torch.testing.assert_close(restored.encode(new), spec.encode(obs)[[3, 0]])
    with pytest.raises(DataError, match=r"categories the model was not trained on: \['z'\]"):
        spec.encode(obs.assign(batch=["a", "z", "b", "b"]))
    with pytest.raises(DataError, match="no column 'batch'"):
        spec.encode(obs.drop(columns="batch"))


def test_counterfactual_batch(obs):
    spec = CovariateSpec.fit(obs, batch_key="batch")
    swapped = spec.with_batch(spec.encode(obs), "c")
    np.testing.assert_array_equal(swapped.numpy(), np.tile([0.0, 0.0, 1.0], (4, 1)))
    with pytest.raises(DataError, match="not one of the training batches"):
        spec.with_batch(spec.encode(obs), "x")


def test_bad_columns_are_named(obs):
    with pytest.raises(DataError, match="no column 'sample'"):
        CovariateSpec.fit(obs, batch_key="sample")
    with pytest.raises(DataError, match="NaN or infinite"):
        CovariateSpec.fit(obs.assign(percent_mito=[0.1, np.nan, 0.2, 0.3]), continuous_keys=["percent_mito"])


@pytest.mark.parametrize("values", [[1.0, 2.0, np.nan, 1.0], ["a", None, "b", "a"], ["a", "b", np.nan, "a"]])
def test_missing_categories_are_named(obs, values):
    # A missing value is no category ('nan' would be one, and NaN != NaN made one per missing value).
    table = obs.assign(batch=values)
    with pytest.raises(DataError, match=r"adata.obs\['batch'\] has 1 missing values"):
        CovariateSpec.fit(table, batch_key="batch")
    spec = CovariateSpec.fit(obs, batch_key="batch")
    with pytest.raises(DataError, match="1 missing values"):
        spec.encode(obs.assign(batch=pandas.Categorical(["a", None, "b", "a"])))
