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


@pytest.mark.parametrize("column", [
    pandas.to_datetime(["2021-03-01", "2021-04-12", "2021-03-01", "2021-04-12"]),
    pandas.Categorical(pandas.to_datetime(["2021-03-01", "2021-04-12", "2021-03-01", "2021-04-12"])),
    np.array([0.1, 0.2, 0.1, 0.2], dtype=np.float32),
    np.array([0.1, 0.2, 0.1, 0.2], dtype=np.float16),
    np.array([b"r1", b"r2", b"r1", b"r2"]),
    pandas.to_timedelta([1, 2, 1, 2], unit="h"),
    np.array([1, 1.5, 1, 1.5], dtype=object),
])
def test_training_data_are_encoded_as_trained_whatever_the_column_type(obs, column):
    # The text of a category was str() of the Python value at fitting and numpy's text at encoding:
    # a datetime or float32 column refused its own training data as unseen.
    spec = CovariateSpec.fit(obs.assign(run=column), batch_key="run")
    assert spec.num_batches == 2
    np.testing.assert_array_equal(spec.encode(obs.assign(run=column)).numpy(), [[1, 0], [0, 1], [1, 0], [0, 1]])


def test_counterfactual_batch(obs):
    spec = CovariateSpec.fit(obs, batch_key="batch")
    swapped = spec.with_batch(spec.encode(obs), "c")
    np.testing.assert_array_equal(swapped.numpy(), np.tile([0.0, 0.0, 1.0], (4, 1)))
    with pytest.raises(DataError, match="not one of the training batches"):
        spec.with_batch(spec.encode(obs), "x")


def test_bad_columns_are_named(obs):
    with pytest.raises(DataError, match="no column 'sample'"):
        CovariateSpec.fit(obs, batch_key="sample")
    with pytest.raises(DataError, match=r"columns \['batch'\] are registered both as categorical"):
        CovariateSpec.fit(obs, batch_key="batch", continuous_keys=["batch"])
    with pytest.raises(DataError, match="mixes types"):
        CovariateSpec.fit(obs.assign(donor=[1, "d2", 1, 1]), batch_key="donor")
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


def test_the_saved_layout_keeps_the_training_order_through_a_json_file(obs, tmp_path):
    # Model files write their config with sorted keys: the layout must not depend on dict order.
    import json

    table = obs.rename(columns={"batch": "zbatch", "donor": "adonor", "percent_mito": "z_mito"}).assign(
        a_age=[30.0, 40.0, 50.0, 60.0])
    spec = CovariateSpec.fit(table, batch_key="zbatch", categorical_keys=["adonor"], continuous_keys=["z_mito", "a_age"])
    restored = CovariateSpec.from_config(json.loads(json.dumps(spec.to_config(), sort_keys=True)))
    assert list(restored.categorical) == ["zbatch", "adonor"] and list(restored.continuous) == ["z_mito", "a_age"]
    torch.testing.assert_close(restored.encode(table), spec.encode(table))
    torch.testing.assert_close(restored.with_batch(restored.encode(table), "a"), spec.with_batch(spec.encode(table), "a"))


def test_layouts_saved_as_dicts_by_earlier_versions(obs):
    spec = CovariateSpec.fit(obs, batch_key="batch", categorical_keys=["donor"], continuous_keys=["percent_mito"])
    # Earlier files: dicts with sorted keys; one key besides the batch (batch first) is unambiguous.
    old = {"categorical": dict(sorted(spec.categorical.items(), reverse=True)),
           "continuous": dict(spec.continuous), "batch_key": "batch"}
    torch.testing.assert_close(CovariateSpec.from_config(old).encode(obs), spec.encode(obs))
    ambiguous = {**old, "continuous": {"percent_mito": [0.0, 1.0], "age": [0.0, 1.0]}}
    with pytest.raises(DataError, match="did not keep the order of its covariates"):
        CovariateSpec.from_config(ambiguous)


def test_unused_categories_of_a_categorical_dtype_are_not_trained_categories(obs):
    table = obs.assign(batch=pandas.Categorical(["b", "a", "b", "a"], categories=["a", "b", "c"]))
    spec = CovariateSpec.fit(table, batch_key="batch")
    assert spec.categorical["batch"] == ["a", "b"] and spec.num_batches == 2
    with pytest.raises(DataError, match=r"not trained on: \['c'\]"):
        spec.encode(obs)


def test_continuous_covariates_out_of_range_or_not_numbers_are_named(obs):
    spec = CovariateSpec.fit(obs, continuous_keys=["percent_mito"])
    mean, sd = spec.continuous["percent_mito"]
    # A unit mistake (here 1,001 training sds away) is refused; 999 sds is extrapolation, but allowed.
    with pytest.raises(DataError, match=r"adata.obs\['percent_mito'\] has values more than 1e\+03 training sds"):
        spec.encode(obs.assign(percent_mito=[0.1, mean + 1001 * sd, 0.2, 0.3]))
    assert spec.encode(obs.assign(percent_mito=[0.1, mean + 999 * sd, 0.2, 0.3]))[1, 0] == pytest.approx(999)
    with pytest.raises(DataError, match=r"\['percent_mito'\] is a continuous covariate but has values that are not"):
        spec.encode(obs.assign(percent_mito=["x", "0.1", "0.2", "0.3"]))
    with pytest.raises(DataError, match="not numbers"):
        CovariateSpec.fit(obs.assign(percent_mito=["x", "0.1", "0.2", "0.3"]), continuous_keys=["percent_mito"])
    # A missing column is named as missing, not as "not numbers".
    with pytest.raises(DataError, match=r"adata.obs has no column 'percent_mito'"):
        spec.encode(obs.drop(columns="percent_mito"))
