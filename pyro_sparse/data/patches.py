r"""
Whitened natural-image patches, built the way Olshausen & Field did.

Fallah & Rozell (ICML 2022), Sec. 4.1, train the linear generator on "the
whitened image patches used in (Olshausen & Field, 1996)": 80,000 training and
16,000 validation 16x16 patches (Appendix D). Their data file (Olshausen's ten
whitened 512x512 images) is not shipped with any package, so the images are
rebuilt here from photographs that *are* installed, and nothing is downloaded:

* always: the two photographs of :func:`sklearn.datasets.load_sample_images`
  (``china``, ``flower``; 427x640 JPEG, RGB);
* when scikit-image is importable: the natural-scene photographs and textures
  among the files shipped inside its wheel (:data:`SKIMAGE_IMAGE_NAMES`; each is
  used only if its file is present in the installed ``skimage/data`` folder --
  the file is read directly, so the pooch download machinery is never touched).

Pipeline
--------
1. Grey level: RGB(A) images are converted with the ITU-R BT.709 luma weights
   ``0.2125 R + 0.7154 G + 0.0721 B`` (alpha dropped); intensities in [0, 1].
2. Whitening (Olshausen & Field 1997, Sec. "Image preprocessing"; their
   ``make-your-own-images`` code): in the Fourier domain multiply by

   .. math::  R(f) = |f| \exp(-(|f| / f_0)^4),

   with ``|f|`` the radial frequency in cycles/pixel and ``f_0 = 0.4`` cycles/pixel
   (0.4 N cycles/picture for an N x N image -- about 200 (204.8) for their 512 x 512
   images -- i.e. 0.8 of the Nyquist frequency 0.5 cycles/pixel). The ``|f|`` factor
   flattens the ~1/``|f|^2`` power spectrum of natural images (it removes the DC
   component too); the ``exp(-(|f|/f_0)^4)`` factor rolls off the highest
   frequencies, where noise and aliasing dominate. The roll-off leaves neighbouring
   pixels correlated: an image with an exact 1/``|f|^2`` spectrum comes out with a
   correlation of 0.51 between horizontal neighbours (from the filter alone), and
   the ten images here, whose spectra fall as ``|f|^-1.8`` to ``|f|^-3.1``, with
   0.38-0.73; the patches are whitened as Olshausen & Field's were, not
   decorrelated pixel by pixel. To keep the FFT's periodic
   wrap-around from creating a bright seam along the borders, each image is
   reflect-padded by ``pad`` pixels before filtering and cropped back to its
   original size afterwards. Each whitened image is then scaled to unit variance
   (Olshausen & Field scaled their set jointly; ours come from different cameras
   and contrasts, so each image is equalised to contribute alike).
3. Split *by image*: the validation images are held out entirely. (The authors'
   code cut overlapping patches from all ten images and then split the patches,
   so validation patches overlapped training patches; that is avoided here.)
4. Patches: ``patch_size x patch_size`` windows at uniformly random positions
   (drawn with replacement) inside the images of each split. Each split's patch
   count is shared among its images in proportion to their number of valid
   window positions, so every position of the split is equally likely.
5. Standardisation (``standardize="pixel"``, the default): each of the
   ``patch_size**2`` pixel positions is shifted and scaled by the mean and standard
   deviation of that position over the *training* patches, and the same
   statistics are applied to the validation patches -- this is what the authors'
   released code does (it computed them over all patches, before its split).
   Appendix D does not state a normalisation. ``"global"`` uses one scalar mean and
   standard deviation over all training pixels instead; ``None`` leaves the
   whitened, unit-variance-per-image values. No per-patch mean is removed by
   default (whitening already removes each image's DC component).

Everything random is drawn from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SKIMAGE_IMAGE_NAMES",
    "SKLEARN_IMAGE_NAMES",
    "PatchData",
    "available_skimage_images",
    "load_natural_images",
    "radial_power_spectrum",
    "to_grey",
    "whiten_image",
    "whitened_patches",
    "whitening_filter",
]

#: The two photographs of ``sklearn.datasets.load_sample_images()``.
SKLEARN_IMAGE_NAMES = ("china", "flower")

#: Natural photographs and textures that scikit-image ships inside its wheel
#: (``skimage/data/<file>``), as ``name -> file``. Left out: the synthetic, text,
#: microscopy, medical, astronomical and silhouette images of that folder, and two
#: photographs whose spectra are far from natural-image statistics: ``brick`` (its
#: power falls about 100-fold between 0.1 and 0.2 cycles/pixel and then sits on a
#: flat floor -- a blurred/upsampled image) and ``moon`` (same shape); whitening would
#: mostly amplify their noise floor. With the sklearn pair this gives ten images,
#: as many as Olshausen & Field used.
SKIMAGE_IMAGE_FILES = {
    "camera": "camera.png",
    "astronaut": "astronaut.png",
    "grass": "grass.png",
    "gravel": "gravel.png",
    "chelsea": "chelsea.png",
    "coffee": "coffee.png",
    "rocket": "rocket.jpg",
    "motorcycle_left": "motorcycle_left.png",
}
SKIMAGE_IMAGE_NAMES = tuple(SKIMAGE_IMAGE_FILES)

_LUMA = np.array([0.2125, 0.7154, 0.0721])


# --------------------------------------------------------------------------- loading


def to_grey(image) -> np.ndarray:
    """Float64 grey-level image in [0, 1] from a 2-D grey or 3-D RGB(A) array."""
    img = np.asarray(image)
    if np.issubdtype(img.dtype, np.integer):
        img = img.astype(np.float64) / float(np.iinfo(img.dtype).max)
    else:
        img = img.astype(np.float64)
    if img.ndim == 3:
        if img.shape[-1] == 4:
            img = img[..., :3]
        if img.shape[-1] == 3:
            img = img @ _LUMA
        elif img.shape[-1] == 1:
            img = img[..., 0]
        else:
            raise ValueError(f"unsupported image shape {img.shape}")
    if img.ndim != 2:
        raise ValueError(f"unsupported image shape {img.shape}")
    return img


def _skimage_data_dir() -> str | None:
    """The installed ``skimage/data`` folder, or None if scikit-image cannot be imported."""
    try:
        import skimage
    except ImportError:
        return None
    return os.path.join(os.path.dirname(skimage.__file__), "data")


def available_skimage_images() -> tuple[str, ...]:
    """Names of :data:`SKIMAGE_IMAGE_NAMES` whose files are shipped in the installed scikit-image."""
    folder = _skimage_data_dir()
    if folder is None:
        return ()
    return tuple(
        name
        for name, file in SKIMAGE_IMAGE_FILES.items()
        if os.path.isfile(os.path.join(folder, file))
    )


def _read_skimage_file(name: str) -> np.ndarray:
    from skimage import io  # imported only when scikit-image is present

    return io.imread(os.path.join(_skimage_data_dir(), SKIMAGE_IMAGE_FILES[name]))


def load_natural_images(include_skimage: bool | None = None) -> dict[str, np.ndarray]:
    """
    Grey-level source images, ``name -> (H, W) float64`` in [0, 1].

    scikit-learn's ``china`` and ``flower`` always; scikit-image's shipped
    photographs (:func:`available_skimage_images`) when ``include_skimage`` is True
    or None (= when scikit-image can be imported). ``include_skimage=True``
    without scikit-image raises :class:`ImportError`.
    """
    from sklearn.datasets import load_sample_images

    sample = load_sample_images()
    names = [os.path.splitext(os.path.basename(f))[0] for f in sample.filenames]
    images = {name: to_grey(img) for name, img in zip(names, sample.images)}
    if include_skimage is None:
        include_skimage = _skimage_data_dir() is not None
    if include_skimage:
        if _skimage_data_dir() is None:
            raise ImportError("include_skimage=True but scikit-image is not installed")
        for name in available_skimage_images():
            images[name] = to_grey(_read_skimage_file(name))
    return images


# --------------------------------------------------------------------------- whitening


def whitening_filter(shape: tuple[int, int], f0: float = 0.4) -> np.ndarray:
    """
    ``R(f) = |f| exp(-(|f|/f0)^4)`` on the unshifted FFT grid of an image of ``shape``
    (frequencies in cycles/pixel from :func:`numpy.fft.fftfreq`; ``f0 = 0.4`` cycles/pixel
    is Olshausen & Field's ``0.4 N`` cycles/picture).
    """
    fy = np.fft.fftfreq(shape[0])[:, None]
    fx = np.fft.fftfreq(shape[1])[None, :]
    rho = np.sqrt(fx * fx + fy * fy)
    if not (np.isfinite(f0) and f0 > 0):
        raise ValueError(f"f0 (the whitening filter's roll-off, cycles/pixel) must be positive, got {f0!r}")
    return rho * np.exp(-((rho / f0) ** 4))


def whiten_image(
    image, f0: float = 0.4, pad: int = 16, unit_variance: bool = True
) -> np.ndarray:
    """
    Whiten one grey image with :func:`whitening_filter` (see the module docstring):
    reflect-pad by ``pad`` pixels, filter in the Fourier domain, crop back, and
    (``unit_variance``) centre and scale to unit variance.
    """
    img = np.asarray(image, dtype=np.float64)
    if img.ndim != 2:
        raise ValueError("whiten_image expects a 2-D grey image")
    if pad < 0:
        raise ValueError(f"pad must be >= 0, got {pad!r}")
    padded = np.pad(img, pad, mode="reflect") if pad > 0 else img
    spectrum = np.fft.fft2(padded) * whitening_filter(padded.shape, f0)
    white = np.real(np.fft.ifft2(spectrum))
    if pad > 0:
        white = white[pad:-pad, pad:-pad]
    if unit_variance:
        white = white - white.mean()
        std = white.std()
        if std > 0:
            white = white / std
    return white


def radial_power_spectrum(image, num_bins: int = 32, window: bool = True):
    """
    Radially averaged power spectrum of a 2-D image (mean removed; Hann window by
    default to limit leakage from the borders). Returns ``(frequencies, power)``
    with frequencies the bin centres in cycles/pixel, in (0, 0.5]; empty bins are
    dropped.
    """
    img = np.asarray(image, dtype=np.float64)
    img = img - img.mean()
    if window:
        img = img * np.outer(np.hanning(img.shape[0]), np.hanning(img.shape[1]))
    power = np.abs(np.fft.fft2(img)) ** 2
    fy = np.fft.fftfreq(img.shape[0])[:, None]
    fx = np.fft.fftfreq(img.shape[1])[None, :]
    rho = np.sqrt(fx * fx + fy * fy).ravel()
    edges = np.linspace(0.0, 0.5, num_bins + 1)
    which = np.digitize(rho, edges, right=True) - 1  # bins (a, b]: the Nyquist frequency 0.5 is in the last
    keep = (which >= 0) & (which < num_bins) & (rho > 0)
    sums = np.bincount(which[keep], weights=power.ravel()[keep], minlength=num_bins)
    counts = np.bincount(which[keep], minlength=num_bins)
    centres = 0.5 * (edges[:-1] + edges[1:])
    ok = counts > 0
    return centres[ok], sums[ok] / counts[ok]


@functools.lru_cache(maxsize=8)
def _whitened_images(
    include_skimage: bool, f0: float, pad: int
) -> tuple[tuple[str, np.ndarray], ...]:
    out = []
    for name, img in load_natural_images(include_skimage).items():
        white = whiten_image(img, f0=f0, pad=pad)
        white.setflags(write=False)  # cached: callers must not modify it
        out.append((name, white))
    return tuple(out)


# --------------------------------------------------------------------------- patches


@dataclass(frozen=True)
class PatchData:
    """
    Whitened patches split by source image.

    ``train`` and ``validation`` are (n, patch_size**2) float32, each row a patch
    flattened in row-major (C) order; the image-name tuples say which source
    images each split was cut from (disjoint). ``mean``/``std`` are the
    standardisation statistics (from the training patches) that were applied,
    shaped (patch_size**2,) for ``"pixel"``, scalars for ``"global"``, None otherwise.
    """

    train: np.ndarray
    validation: np.ndarray
    image_names_train: tuple
    image_names_validation: tuple
    mean: np.ndarray | float | None = None
    std: np.ndarray | float | None = None


def _largest_remainder(total: int, weights: np.ndarray) -> np.ndarray:
    share = total * weights / weights.sum()
    counts = np.floor(share).astype(np.int64)
    rest = total - counts.sum()
    if rest > 0:
        order = np.argsort(-(share - counts), kind="stable")
        counts[order[:rest]] += 1
    return counts


def _cut(images, names, total, patch_size, rng) -> np.ndarray:
    if total == 0:
        return np.zeros((0, patch_size * patch_size))
    positions = np.array(
        [
            (images[n].shape[0] - patch_size + 1)
            * (images[n].shape[1] - patch_size + 1)
            for n in names
        ],
        dtype=np.float64,
    )
    counts = _largest_remainder(total, positions)
    out = np.empty((total, patch_size * patch_size))
    row = 0
    for name, count in zip(names, counts):
        img = images[name]
        r = rng.integers(0, img.shape[0] - patch_size + 1, size=count)
        c = rng.integers(0, img.shape[1] - patch_size + 1, size=count)
        # Gather every window at once through a strided view (no copy of the image).
        windows = np.lib.stride_tricks.sliding_window_view(
            img, (patch_size, patch_size)
        )
        out[row : row + count] = windows[r, c].reshape(count, -1)
        row += count
    # Interleave the images' patches so that any prefix is a mix of all of them.
    return out[rng.permutation(total)]


def whitened_patches(
    num_patches: int,
    patch_size: int = 16,
    seed: int = 0,
    validation_images=None,
    *,
    num_validation: int | None = None,
    standardize: str | None = "pixel",
    include_skimage: bool | None = None,
    f0: float = 0.4,
    pad: int = 16,
) -> PatchData:
    """
    Training and validation patches of whitened natural images, split by image.

    Parameters
    ----------
    num_patches : number of training patches (the paper uses 80,000).
    patch_size : side of the square patches (16 in the paper); rows have
        ``patch_size**2`` entries.
    seed : seeds every random choice (validation images when chosen at random,
        patch positions, order); the same arguments give the same arrays.
    validation_images : which source images are held out for validation: an int
        ``k`` (``k`` images drawn at random with ``seed``), or a sequence of image
        names; ``None`` means ``max(1, round(0.2 * number_of_images))`` (the authors
        held out 2 of their 10 images' worth of patches). With only scikit-learn's
        two photographs that is one image each.
    num_validation : number of validation patches; default ``num_patches // 5``
        (the paper's 16,000 for 80,000).
    standardize : ``"pixel"`` (default), ``"global"`` or ``None`` -- see the module
        docstring; statistics always come from the training patches.
    include_skimage : use scikit-image's shipped photographs too: None (default)
        = if scikit-image is importable.
    f0, pad : whitening roll-off frequency (cycles/pixel) and reflect padding.

    Returns
    -------
    :class:`PatchData` with ``train`` (num_patches, patch_size**2) and ``validation``
    (num_validation, patch_size**2), float32.
    """
    num_validation = _check_patch_options(num_patches, patch_size, num_validation, standardize)
    if include_skimage is None:
        include_skimage = _skimage_data_dir() is not None

    images = dict(_whitened_images(bool(include_skimage), float(f0), int(pad)))
    names = list(images)
    too_small = [n for n in names if min(images[n].shape) < patch_size]
    if too_small:
        raise ValueError(f"patch_size {patch_size} is larger than images {too_small}")
    rng = np.random.default_rng(seed)
    val_names = _validation_names(validation_images, names, rng)
    train_names = [n for n in names if n not in set(val_names)]
    if num_validation > 0 and not val_names:
        raise ValueError("num_validation > 0 needs at least one validation image")

    train = _cut(images, train_names, num_patches, patch_size, rng)
    validation = _cut(images, val_names, num_validation, patch_size, rng)
    train, validation, mean, std = _standardize(train, validation, standardize)
    return PatchData(
        train=np.ascontiguousarray(train, dtype=np.float32),
        validation=np.ascontiguousarray(validation, dtype=np.float32),
        image_names_train=tuple(train_names),
        image_names_validation=tuple(val_names),
        mean=mean,
        std=std,
    )


def _check_patch_options(num_patches, patch_size, num_validation, standardize) -> int:
    """Validate the sizes and ``standardize``; returns ``num_validation`` (default ``num_patches // 5``)."""
    if num_patches < 1:
        raise ValueError("num_patches must be >= 1")
    if patch_size < 2:
        raise ValueError("patch_size must be >= 2")
    if num_validation is None:
        num_validation = num_patches // 5
    if num_validation < 0:
        raise ValueError("num_validation must be >= 0")
    if standardize not in ("pixel", "global", None):
        raise ValueError("standardize must be 'pixel', 'global' or None")
    return num_validation


def _validation_names(validation_images, names, rng) -> list:
    """
    The held-out images: ``None`` -> ``max(1, round(0.2 * len(names)))`` drawn at random,
    an int ``k`` -> ``k`` drawn at random (in ``names`` order), else the given names.
    """
    if validation_images is None:
        validation_images = max(1, round(0.2 * len(names)))
    if isinstance(validation_images, (int, np.integer)):
        k = int(validation_images)
        if not 0 <= k < len(names):
            raise ValueError(
                f"validation_images={k}: need 0 <= k < {len(names)} (number of source images)"
            )
        chosen = set(rng.choice(len(names), size=k, replace=False).tolist())
        return [n for i, n in enumerate(names) if i in chosen]
    if isinstance(validation_images, str):
        validation_images = [validation_images]
    val_names = list(dict.fromkeys(str(n) for n in validation_images))  # each image once, in the order given
    unknown = [n for n in val_names if n not in names]
    if unknown:
        raise ValueError(f"unknown validation images {unknown}; available: {names}")
    if len(set(val_names)) == len(names):
        raise ValueError("at least one image must be left for training")
    return val_names


def _standardize(train, validation, standardize):
    """
    Standardise both splits with the training patches' statistics (module docstring,
    step 5). Returns ``(train, validation, mean, std)``: float32 (patch_size**2,)
    statistics for ``"pixel"``, floats for ``"global"``, ``None`` for ``None``. A zero
    standard deviation is replaced by 1.
    """
    if standardize is None:
        return train, validation, None, None
    if standardize == "pixel":
        mean = train.mean(axis=0)
        std = train.std(axis=0)
        std = np.where(std > 0, std, 1.0)
    else:
        mean = float(train.mean())
        std = float(train.std()) or 1.0
    train = (train - mean) / std
    validation = (validation - mean) / std
    if standardize == "pixel":
        mean, std = mean.astype(np.float32), std.astype(np.float32)
    return train, validation, mean, std
