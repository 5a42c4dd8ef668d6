"""Tests of pyro_sparse.patches: whitened natural-image patches split by image."""

import sys

import numpy as np
import pytest

from pyro_sparse.data import patches as P
from pyro_sparse.data.patches import (
    PatchData,
    load_natural_images,
    radial_power_spectrum,
    whiten_image,
    whitened_patches,
    whitening_filter,
)

HAVE_SKIMAGE = P._skimage_data_dir() is not None


@pytest.fixture(scope="module")
def small():
    return whitened_patches(2000, patch_size=16, seed=0)


def _slope(image, lo=0.04, hi=0.25):
    f, p = radial_power_spectrum(image, num_bins=32)
    m = (f >= lo) & (f <= hi)
    return np.polyfit(np.log(f[m]), np.log(p[m]), 1)[0]


def test_the_spectrum_includes_the_nyquist_frequency():
    stripes = np.tile([1.0, -1.0], (8, 4))  # columns alternate: all power at |f| = 0.5
    f, p = radial_power_spectrum(stripes, num_bins=4, window=False)
    assert f[-1] == pytest.approx(0.4375) and p[-1] > 0 and p[:-1].sum() == 0


# --------------------------------------------------------------------------- shapes and determinism


def test_shapes_dtypes_and_names(small):
    assert isinstance(small, PatchData)
    assert small.train.shape == (2000, 256) and small.train.dtype == np.float32
    assert small.validation.shape == (400, 256) and small.validation.dtype == np.float32
    assert small.train.flags.c_contiguous
    assert np.isfinite(small.train).all() and np.isfinite(small.validation).all()
    names = set(small.image_names_train) | set(small.image_names_validation)
    assert {"china", "flower"} <= names


def test_patch_size_and_counts():
    d = whitened_patches(300, patch_size=8, seed=1, num_validation=50)
    assert d.train.shape == (300, 64) and d.validation.shape == (50, 64)
    assert d.mean.shape == (64,) and d.std.shape == (64,)


def test_deterministic_per_seed(small):
    again = whitened_patches(2000, patch_size=16, seed=0)
    np.testing.assert_array_equal(small.train, again.train)
    np.testing.assert_array_equal(small.validation, again.validation)
    assert small.image_names_validation == again.image_names_validation
    other = whitened_patches(2000, patch_size=16, seed=1)
    assert not np.array_equal(small.train, other.train)


# --------------------------------------------------------------------------- standardisation


def test_pixel_standardisation(small):
    # per-pixel statistics of the training patches: mean 0, std 1 (by construction)
    np.testing.assert_allclose(small.train.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(small.train.std(0), 1.0, atol=1e-4)
    # validation uses the training statistics: close to, not exactly, standardised
    assert abs(small.validation.mean()) < 0.1
    assert 0.5 < small.validation.std() < 2.0


def test_global_and_no_standardisation():
    g = whitened_patches(1000, seed=2, standardize="global")
    assert abs(g.train.mean()) < 1e-5 and abs(g.train.std() - 1.0) < 1e-4
    assert np.isscalar(g.mean) and np.isscalar(g.std)
    raw = whitened_patches(1000, seed=2, standardize=None)
    assert raw.mean is None and raw.std is None
    # same patches, only an affine map apart
    np.testing.assert_allclose((raw.train - g.mean) / g.std, g.train, atol=1e-4)


# --------------------------------------------------------------------------- whitening


def test_filter_formula():
    filt = whitening_filter((64, 48), f0=0.4)
    fy = np.fft.fftfreq(64)[:, None]
    fx = np.fft.fftfreq(48)[None, :]
    rho = np.hypot(fx, fy)
    np.testing.assert_allclose(filt, rho * np.exp(-((rho / 0.4) ** 4)))
    assert filt[0, 0] == 0.0  # DC removed


def test_whitening_flattens_spectrum():
    images = load_natural_images(include_skimage=False)
    raw, white = [], []
    for img in images.values():
        w = whiten_image(img)
        assert w.shape == img.shape
        assert abs(w.mean()) < 1e-8 and abs(w.std() - 1.0) < 1e-8
        raw.append(_slope(img))
        white.append(_slope(w))
    raw, white = np.array(raw), np.array(white)
    # raw natural images: power ~ 1/f^2 (slope about -2); whitened: close to flat
    assert (raw < -1.5).all()
    assert (np.abs(white) < 0.6).all()
    assert (np.abs(white) < 0.3 * np.abs(raw)).all()
    # the |f| factor adds exactly +2 to the log-log slope, up to the mild roll-off
    assert np.allclose(white - raw, 2.0, atol=0.3)


def test_whitening_of_pink_noise_is_white():
    # Synthetic 1/f amplitude noise: the filter should make its spectrum flat below f0.
    rng = np.random.default_rng(0)
    n = 256
    fy = np.fft.fftfreq(n)[:, None]
    fx = np.fft.fftfreq(n)[None, :]
    rho = np.hypot(fx, fy)
    rho[0, 0] = 1.0
    pink = np.real(np.fft.ifft2(np.fft.fft2(rng.normal(size=(n, n))) / rho))
    assert _slope(pink) < -1.8
    assert abs(_slope(whiten_image(pink, pad=0), 0.02, 0.2)) < 0.2
    # The roll-off alone keeps neighbours correlated: Σ S(f) cos(2π f_x) / Σ S(f) with
    # S = exp(-2 (|f| / f0)^4) on the FFT grid is 0.51 (the value the module docstring states).
    white = whiten_image(pink, pad=0)
    neighbours = np.corrcoef(white[:, :-1].ravel(), white[:, 1:].ravel())[0, 1]
    S = np.exp(-2 * (np.hypot(fx, fy) / 0.4) ** 4) * (np.hypot(fx, fy) > 0)
    expected = (S * np.cos(2 * np.pi * fx)).sum() / S.sum()
    assert abs(expected - 0.51) < 0.01
    assert abs(neighbours - expected) < 0.03


# --------------------------------------------------------------------------- split by image


def test_train_and_validation_images_disjoint(small):
    tr, va = set(small.image_names_train), set(small.image_names_validation)
    assert tr and va and not (tr & va)
    if HAVE_SKIMAGE:
        assert len(va) == 2  # 20 % of ten images


def test_explicit_validation_images():
    d = whitened_patches(
        500, seed=3, validation_images=["flower"], include_skimage=False
    )
    assert d.image_names_validation == ("flower",) and d.image_names_train == ("china",)
    with pytest.raises(ValueError):
        whitened_patches(
            500, validation_images=["no_such_image"], include_skimage=False
        )
    with pytest.raises(ValueError):
        whitened_patches(
            500, validation_images=["china", "flower"], include_skimage=False
        )


def test_patches_really_come_from_their_images():
    # Every validation patch must be a window of a validation image (exact match before
    # standardisation), and of no training image.
    d = whitened_patches(
        200,
        patch_size=8,
        seed=4,
        num_validation=20,
        standardize=None,
        include_skimage=False,
    )
    white = {n: w.astype(np.float32) for n, w in P._whitened_images(False, 0.4, 16)}

    def found_in(name, patch):
        img = white[name]
        for r, c in np.argwhere(
            img[: img.shape[0] - 7, : img.shape[1] - 7] == patch[0]
        ):
            if np.array_equal(img[r : r + 8, c : c + 8].ravel(), patch):
                return True
        return False

    (val_name,), (train_name,) = d.image_names_validation, d.image_names_train
    for patch in d.validation[:10]:
        assert found_in(val_name, patch) and not found_in(train_name, patch)
    for patch in d.train[:10]:
        assert found_in(train_name, patch) and not found_in(val_name, patch)


@pytest.mark.skipif(not HAVE_SKIMAGE, reason="scikit-image not installed")
def test_skimage_images_are_used_and_offline():
    names = P.available_skimage_images()
    assert "camera" in names and "astronaut" in names
    images = load_natural_images()
    assert set(names) <= set(images)
    assert all(
        img.ndim == 2 and 0.0 <= img.min() and img.max() <= 1.0
        for img in images.values()
    )


def test_works_without_skimage(monkeypatch):
    # A None entry in sys.modules makes `import skimage` raise ImportError.
    monkeypatch.setitem(sys.modules, "skimage", None)
    assert P._skimage_data_dir() is None
    assert P.available_skimage_images() == ()
    images = load_natural_images()
    assert set(images) == {"china", "flower"}
    d = whitened_patches(600, seed=0)
    assert len(d.image_names_train) == 1 and len(d.image_names_validation) == 1
    assert set(d.image_names_train + d.image_names_validation) == {"china", "flower"}
    assert d.train.shape == (600, 256) and d.validation.shape == (120, 256)
    with pytest.raises(ImportError):
        load_natural_images(include_skimage=True)


def test_argument_validation():
    with pytest.raises(ValueError):
        whitened_patches(0)
    with pytest.raises(ValueError):
        whitened_patches(10, standardize="bogus")
    with pytest.raises(ValueError):
        whitened_patches(10, validation_images=100)


def test_whitening_options_are_checked():
    with pytest.raises(ValueError, match="f0 .* must be positive"):
        P.whitening_filter((8, 8), f0=0.0)
    with pytest.raises(ValueError, match="pad must be >= 0"):
        P.whiten_image(np.random.default_rng(0).normal(size=(16, 16)), pad=-1)


def test_validation_images_by_one_name_or_with_repeats_are_each_taken_once():
    rng = np.random.default_rng(0)
    names = ["china", "flower", "camera"]
    assert P._validation_names("china", names, rng) == ["china"]
    assert P._validation_names(["china", "china", "flower"], names, rng) == ["china", "flower"]
