"""Sparse-coding diagnostics of a dictionary and its codes (pyro_sparse.evaluation.dictionary)."""

import numpy as np
import pytest
import torch

from pyro_sparse.baselines.fista import fista, sparse_coding_objective
from pyro_sparse.evaluation.dictionary import (
    code_density,
    coherence,
    dead_atoms,
    dictionary_grid,
    sparse_coding_report,
)

CODES = np.array([[0.0, 1.0, 0.0, 0.0], [0.0, -2.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0]])


def test_code_density_overall_and_per_atom():
    overall, per_atom = code_density(CODES)
    assert overall == pytest.approx(4 / 16)
    np.testing.assert_allclose(per_atom, [0.0, 0.75, 0.25, 0.0])


def test_dead_atoms():
    np.testing.assert_array_equal(dead_atoms(CODES), [0, 3])
    np.testing.assert_array_equal(dead_atoms(CODES, min_usage=0.25), [0, 2, 3])
    with pytest.raises(ValueError, match="min_usage"):
        dead_atoms(CODES, min_usage=1.0)


def test_coherence():
    assert coherence(np.eye(5)) == (0.0, 0.0)
    repeated = np.array([[1.0, -2.0, 0.0], [0.0, 0.0, 1.0]])  # atom 1 = -2 x atom 0
    largest, mean = coherence(repeated)
    assert largest == pytest.approx(1.0) and mean == pytest.approx(1 / 3)
    # A zero atom is left out rather than dividing by 0.
    assert coherence(np.column_stack([np.eye(3), np.zeros(3)])) == (0.0, 0.0)
    # An atom of tiny norm (its squares underflow) is an atom, not a zero one.
    assert coherence(np.array([[1.0, 0.0, 1e-200], [0.0, 1.0, 1e-200]]))[0] == pytest.approx(np.sqrt(0.5))
    with pytest.raises(ValueError, match="two atoms"):
        coherence(np.ones((3, 1)))


def test_dictionary_grid_tiles_atoms_by_norm():
    rng = np.random.default_rng(0)
    A = rng.normal(size=(16, 7)) * np.arange(1, 8)  # norms increase with the index
    grid = dictionary_grid(A)
    assert grid.shape == (3 * 5 + 1, 3 * 5 + 1)  # ceil(sqrt 7) = 3 columns and rows of 4x4 tiles, 1-pixel gaps
    first = grid[1:5, 1:5]  # the largest atom, scaled to max |.| = 1
    np.testing.assert_allclose(first, A[:, 6].reshape(4, 4) / np.abs(A[:, 6]).max())
    assert np.isnan(grid[0]).all() and np.isnan(grid[-5:-1, -5:-1]).all()  # gaps, and two empty slots
    np.testing.assert_allclose(dictionary_grid(A, order=None)[1:5, 1:5], A[:, 0].reshape(4, 4) / np.abs(A[:, 0]).max())
    assert dictionary_grid(np.zeros((4, 2)), patch_shape=(2, 2))[1:3, 1:3].tolist() == [[0, 0], [0, 0]]
    # Atoms of one norm but for float rounding (shared atom norms) keep their order.
    shared = A / np.linalg.norm(A, axis=0) * (1 + rng.uniform(-1e-7, 1e-7, size=7))
    np.testing.assert_array_equal(dictionary_grid(shared), dictionary_grid(shared, order=None))


def test_dictionary_grid_names_a_patch_size_mismatch():
    with pytest.raises(ValueError, match="not square"):
        dictionary_grid(np.ones((15, 4)))
    with pytest.raises(ValueError, match="has 12 pixels, the atoms have 16"):
        dictionary_grid(np.ones((16, 4)), patch_shape=(3, 4))


def test_report_matches_the_objective_and_fista():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(16, 8))
    X = rng.normal(size=(40, 16))
    Z = np.where(rng.random((40, 8)) < 0.3, rng.normal(size=(40, 8)), 0.0)
    report = sparse_coding_report(X, A, Z, lam=0.5)
    Xt, At, Zt = map(torch.as_tensor, (X, A, Z))
    assert report.objective == pytest.approx(float(sparse_coding_objective(Xt, At, Zt, 0.5).mean()))
    assert report.objective == pytest.approx(report.reconstruction + 0.5 * report.l1)
    recoded = fista(Xt, At, 0.5, num_iterations=2000, tol=1e-5)
    assert report.fista_objective == pytest.approx(float(sparse_coding_objective(Xt, At, recoded, 0.5).mean()))
    assert report.fista_objective < report.objective < report.zero_code_objective + 100
    assert report.zero_code_objective == pytest.approx(0.5 * (X**2).sum(1).mean())
    assert report.density == pytest.approx((Z != 0).mean()) and report.dead_atoms == 0
    assert set(report.as_dict()) >= {"objective", "atom_usage", "coherence_max"}
    assert isinstance(report.as_dict()["atom_usage"], list)


def test_report_names_bad_input():
    A, X, Z = np.ones((16, 4)), np.ones((5, 16)), np.zeros((5, 4))
    with pytest.raises(ValueError, match="16 features .* atoms have 9"):
        sparse_coding_report(X, np.ones((9, 4)), Z, 1.0)
    with pytest.raises(ValueError, match=r"codes must be \(N, K\)"):
        sparse_coding_report(X, A, np.zeros((5, 3)), 1.0)
    bad = X.copy()
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="X has non-finite"):
        sparse_coding_report(bad, A, Z, 1.0)


def test_the_report_of_a_collapsed_dictionary_has_no_coherence_but_the_rest():
    rng = np.random.default_rng(0)
    X, A = rng.normal(size=(10, 5)), np.zeros((5, 3))
    A[:, 0] = rng.normal(size=5)  # one live atom
    report = sparse_coding_report(X, A, np.zeros((10, 3)), 0.1)
    assert np.isnan(report.coherence_max) and np.isnan(report.coherence_mean)
    assert report.dead_atoms == 3 and np.isclose(report.objective, report.zero_code_objective)
