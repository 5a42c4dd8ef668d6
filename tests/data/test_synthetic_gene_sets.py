"""The gene-set count generator: known supports, an annotation with the stated share of wrong and missing
memberships, negative binomial counts around the size factors."""

import numpy as np
import pytest

from pyro_sparse.data.synthetic import synthetic_gene_set_counts


def test_shapes_names_and_counts():
    data = synthetic_gene_set_counts(n=300, num_genes=80, num_sets=4, set_size=10, num_unannotated=2, seed=3)
    assert data.X.shape == (300, 80) and data.X.dtype == np.float32
    assert data.z.shape == (300, 6) and data.support.shape == (80, 6) and data.annotation.shape == (80, 4)
    assert np.all(data.X >= 0) and np.all(data.X == np.round(data.X))
    assert list(data.support.sum(0)) == [10] * 6
    assert data.feature_names[:2] == ("gene000", "gene001") and data.set_names == ("set0", "set1", "set2", "set3")
    assert data.gene_sets()["set1"] == [data.feature_names[g] for g in np.flatnonzero(data.annotation[:, 1])]


@pytest.mark.parametrize("wrong, missing", [(0.2, 0.2), (0.0, 0.3), (0.25, 0.0)])
def test_the_annotation_has_the_stated_errors(wrong, missing):
    data = synthetic_gene_set_counts(n=50, num_genes=200, set_size=20, wrong_fraction=wrong, missing_fraction=missing,
                                     seed=1)
    true = data.support[:, : data.annotation.shape[1]]
    annotated = data.annotation.sum(0)
    # Exact up to rounding to whole genes.
    np.testing.assert_allclose((data.annotation & ~true).sum(0) / annotated, wrong, atol=0.5 / annotated.min())
    np.testing.assert_allclose((~data.annotation & true).sum(0) / true.sum(0), missing, atol=0.5 / 20)


def test_the_counts_follow_the_size_factors_and_the_supports():
    data = synthetic_gene_set_counts(n=3000, num_genes=100, num_sets=3, set_size=15, seed=0)
    # The mean count is the size factor times a proportion that sums to ~1 over genes.
    ratio = data.X.sum(1) / data.library
    assert 0.8 < np.median(ratio) < 1.25
    # A gene no factor drives is independent of every factor; a driven gene is not.
    log_counts = np.log1p(data.X / data.library[:, None] * 1000)
    driven = np.flatnonzero(data.support[:, 0] & (data.support.sum(1) == 1))
    idle = np.flatnonzero(~data.support.any(1))
    assert len(driven) and len(idle)

    def dependence(g, k):  # nonlinear links: correlation with |z| as well as z
        return max(abs(np.corrcoef(log_counts[:, g], f(data.z[:, k]))[0, 1]) for f in (np.abs, np.sin, np.tanh))

    assert np.median([dependence(g, 0) for g in driven]) > 0.2
    assert max(dependence(g, k) for g in idle for k in range(data.z.shape[1])) < 0.1


def test_same_seed_same_data():
    first, second = (synthetic_gene_set_counts(n=100, num_genes=50, set_size=8, seed=7) for _ in range(2))
    np.testing.assert_array_equal(first.X, second.X)
    np.testing.assert_array_equal(first.annotation, second.annotation)
    assert not np.array_equal(first.X, synthetic_gene_set_counts(n=100, num_genes=50, set_size=8, seed=8).X)


@pytest.mark.parametrize("options, message", [
    ({"wrong_fraction": 1.0}, "wrong_fraction and missing_fraction must be in"),
    ({"set_size": 0}, "set_size must be in"),
    ({"set_size": 20}, "set_size must be in \\[1, num_genes=20\\), got 20"),
    ({"wrong_fraction": 0.9}, "wrong_fraction=0.9 needs more wrong genes per set than the 15 genes outside it"),
    ({"num_unannotated": -1}, "num_unannotated must be an integer >= 0"),
    ({"effect": (0.0, 0.0)}, "a zero effect is no support"),
    ({"library_size": 0.0}, "library_size must be a positive finite number"),
    ({"inverse_dispersion": -1.0}, "inverse_dispersion must be a positive finite number"),
    ({"n": 2.5}, "n must be an integer >= 1"),
])
def test_bad_options(options, message):
    with pytest.raises(ValueError, match=message):
        synthetic_gene_set_counts(**{"n": 10, "num_genes": 20, "set_size": 5, **options})
