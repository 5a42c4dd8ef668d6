"""Data entering the library: validation and the data set the models see; loaders in submodules."""

from pyro_sparse.data.dataset import Dataset, DataSummary
from pyro_sparse.data.validation import (
    DataError,
    as_matrix,
    check_feature_names,
    check_training_data,
    check_units,
    check_values,
    feature_names_of,
)

__all__ = [
    "DataError",
    "DataSummary",
    "Dataset",
    "as_matrix",
    "check_feature_names",
    "check_training_data",
    "check_units",
    "check_values",
    "feature_names_of",
]
