"""Figures: each returns a Figure whose panels show the quantities they name."""

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import pyro_sparse  # noqa: E402
from pyro_sparse.interop import plots  # noqa: E402

QUICK = dict(max_epochs=1, batch_size=50, progress=False, hidden_dims=(16,))


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


# Features in shuffled order; by largest |W_jk|: 0, 3 on factor 2; 1, 4 on factor 0; 5 on factor 1; 2 on none.
W = np.array(
    [
        [0.0, 0.1, 2.0],
        [-3.0, 0.0, 0.0],
        [0.0, 0.0, 0.0],
        [0.0, 0.0, -1.0],
        [1.0, 0.0, 0.5],
        [0.0, 4.0, 0.0],
    ]
)
NAMES = ["a", "b", "c", "d", "e", "f"]


@pytest.fixture(scope="module")
def images():
    """100 random 4 x 6 images, and a VAE fitted to them for one epoch."""
    X = np.random.default_rng(0).normal(size=(100, 24)).astype(np.float32)
    return X, pyro_sparse.train("vae", X, latent_dim=3, **QUICK)


def test_loss_curve_draws_training_and_validation_losses():
    figure = plots.loss_curve({"train_loss": [3.0, 2.0, 1.5], "validation_loss": [3.1, 2.2, 1.9]})
    assert isinstance(figure, matplotlib.figure.Figure)
    (axis,) = figure.axes
    assert [list(line.get_ydata()) for line in axis.lines] == [[3.0, 2.0, 1.5], [3.1, 2.2, 1.9]]


def test_the_command_line_closes_the_figures_it_writes(tmp_path):
    # Run in-process (tests, notebooks), each run left its four or five pyplot figures open.
    from pyro_sparse.interop.cli import main

    before = plt.get_fignums()
    for run in range(2):
        assert main(["train", "--n", "60", "--epochs", "1", "--latent-dim", "2", "--quiet",
                     "--out", str(tmp_path / str(run))]) == 0
    assert plt.get_fignums() == before


def test_mask_heatmap_groups_features_by_factor():
    figure = plots.mask_heatmap(W, NAMES)
    heatmap, colorbar = figure.axes
    # factor 0: b (3.0) then e (1.0); factor 1: f; factor 2: a (2.0) then d (1.0); c unused
    order = [1, 4, 5, 0, 3, 2]
    shown = heatmap.images[0].get_array()
    np.testing.assert_array_equal(shown.filled(0), np.abs(W[order]))
    assert shown.mask[-1].all()  # exact zeros are masked (drawn white)
    assert [label.get_text() for label in heatmap.get_yticklabels()] == [NAMES[j] for j in order]
    unordered = plots.mask_heatmap(W, NAMES, order_by_factor=False).axes[0]
    np.testing.assert_array_equal(unordered.images[0].get_array().filled(0), np.abs(W))


@pytest.mark.parametrize("draw", [plots.mask_heatmap, plots.top_features])
def test_names_must_be_one_per_feature(draw):
    for names in (NAMES[:-1], NAMES + ["extra"]):
        with pytest.raises(ValueError, match=f"got {len(names)} feature names for 6 features"):
            draw(W, feature_names=names)


def test_top_features_draws_one_bar_chart_per_factor_in_use():
    W_unused_factor = np.concatenate([W, np.zeros((6, 1))], axis=1)
    figure = plots.top_features(W_unused_factor, k=2, feature_names=NAMES)
    assert len(figure.axes) == 3  # factor 3 uses no feature
    for axis, factor, expected in zip(figure.axes, range(3), [["b", "e"], ["f", "a"], ["a", "d"]]):
        assert axis.get_title() == f"factor {factor}"
        assert [label.get_text() for label in axis.get_yticklabels()] == expected
        widths = [bar.get_width() for bar in axis.patches]
        np.testing.assert_array_equal(widths, [W[NAMES.index(name), factor] for name in expected])
    with pytest.raises(ValueError, match="identically zero"):
        plots.top_features(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"\(features x factors\) matrix"):
        plots.top_features(np.ones((3, 2, 2)))


def test_latent_traversal_decodes_one_varied_coordinate_per_row(images):
    X, fitted = images
    figure = plots.latent_traversal(fitted, X[:1], (4, 6), values=(-2.0, 0.0, 2.0))
    assert len(figure.axes) == 3 * 3  # three code dimensions by three values
    panels = np.array([axis.images[0].get_array() for axis in figure.axes]).reshape(3, 3, 4, 6)
    assert not np.allclose(panels[0, 0], panels[0, 2])  # the decoder responds to z_0
    # With z_1 set to its posterior mode the code is E_q[z | x] (a Gaussian q),
    # so the panel is the reconstruction of x.
    z_1 = float(fitted.transform(X[:1])[0, 1])
    single = plots.latent_traversal(fitted, X[:1], (4, 6), dims=[1], values=(-1.0, z_1, 1.0))
    assert len(single.axes) == 3
    np.testing.assert_allclose(single.axes[1].images[0].get_array(), fitted.reconstruct(X[:1]).reshape(4, 6), atol=1e-5)


def test_latent_traversal_rejects_what_it_cannot_draw(images):
    X, fitted = images
    with pytest.raises(ValueError, match="image_shape must be .* 24 features"):
        plots.latent_traversal(fitted, X[:1], (5, 5))
    with pytest.raises(ValueError, match=r"one data point of shape \(1, G\)"):
        plots.latent_traversal(fitted, X[:2], (4, 6))
    with pytest.raises(ValueError, match=r"code dimensions in \[0, 3\)"):
        plots.latent_traversal(fitted, X[:1], (4, 6), dims=[3])
    nmf = pyro_sparse.train("nmf", np.abs(X), latent_dim=2)
    with pytest.raises(ValueError, match="'nmf' has none"):
        plots.latent_traversal(nmf, np.abs(X[:1]), (4, 6))


def test_sparsity_histograms_count_non_zero_codes():
    codes = np.array([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, -1.0, 0.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    figure = plots.sparsity_histograms(codes)
    per_point, per_dimension = figure.axes
    # data points with 0, 1, 2, 3, 4 non-zero codes: 1, 2, 1, 0, 0
    assert [bar.get_height() for bar in per_point.patches] == [1, 2, 1, 0, 0]
    assert [bar.get_height() for bar in per_dimension.patches] == [0.0, 0.5, 0.5, 0.0]


def test_command_line_writes_sparsity_and_traversal_figures(tmp_path, capsys):
    from pyro_sparse.interop.cli import main

    X = np.random.default_rng(0).normal(size=(60, 24))
    np.save(tmp_path / "images.npy", X)
    options = ["--data", str(tmp_path / "images.npy"), "--epochs", "1", "--latent-dim", "3", "--quiet"]
    assert main(["train", "--model", "vsc", *options, "--image-shape", "4,6", "--out", str(tmp_path / "run")]) == 0
    assert {"loss.png", "sparsity.png", "traversal.png"} <= {p.name for p in (tmp_path / "run").iterdir()}
    assert main(["train", "--model", "vsc", *options, "--image-shape", "5,5", "--out", str(tmp_path / "bad")]) == 2
    assert "height * width = 24 features" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # rejected before training


def test_the_command_line_draws_sparsity_for_sparse_codes_not_for_switched_off_factors():
    # A factor the sparse VAE switched off (a zero column of W) has codes reported as 0: not sparse codes.
    import torch

    from pyro_sparse.interop.cli import _figures

    X = np.random.default_rng(0).normal(size=(60, 6)).astype(np.float32)
    fitted = pyro_sparse.train("ssl_dgm", X, latent_dim=3, **QUICK)
    with torch.no_grad():
        fitted.guide.unconstrained["W"][:, 0] = 0.0
    assert (fitted.transform(X)[:, 0] == 0).all()
    assert "sparsity.png" not in _figures(fitted, X, None, None)


def test_top_features_and_traversals_name_bad_arguments():
    from pyro_sparse.fitted import top_features

    W = np.array([[1.0, 0.0], [0.5, 2.0]])
    with pytest.raises(ValueError, match="k must be a positive integer"):
        top_features(W, k=0)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        plots.top_features(W, k=-2)
    with pytest.raises(AttributeError, match=r"\(features x factors\) W; this W has shape \(2, 2, 1\)"):
        top_features(W[..., None])
