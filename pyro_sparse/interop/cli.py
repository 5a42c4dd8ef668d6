"""The ``pyro-sparse`` command line."""

import argparse
import dataclasses
import json
import os
import re
import sys
import warnings
import zipfile
import zlib

import numpy as np
import scipy.sparse as sp

from pyro_sparse import evaluation
from pyro_sparse.api import train
from pyro_sparse.data import DataError
from pyro_sparse.data.images import DatasetNotInstalledError
from pyro_sparse.data.real import REAL_DATA
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.distributions.likelihoods import LIKELIHOODS
from pyro_sparse.infer import distributed
from pyro_sparse.infer.config import Checkpointing, Hardware, Schedule
from pyro_sparse.infer.loop import TrainingDivergedError
from pyro_sparse.io import serialization
from pyro_sparse.nn import DecoderMemoryError
from pyro_sparse.priors import LATENT_PRIORS, MASK_PRIORS
from pyro_sparse.registry import MODELS, training_defaults
from pyro_sparse.svi import SVIModel

# What a damaged or truncated numpy file raises as it is read.
_UNREADABLE = (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error)


def _read_npy(source):
    try:
        array = np.load(source, allow_pickle=False)
    except _UNREADABLE as error:
        raise DataError(f"{source!r} is not an array written by numpy.save (without pickling): {error}") from None
    if not isinstance(array, np.ndarray):
        array.close()
        raise DataError(f"{source!r} is an archive of arrays (numpy.savez), not one array: name it .npz")
    return array, None


def _read_npz(source):
    try:
        archive = np.load(source, allow_pickle=False)
    except _UNREADABLE as error:
        raise DataError(f"{source!r} is not an archive written by numpy.savez or scipy.sparse.save_npz: {error}") from None
    with archive:
        members = archive.files
        if len(members) > 1 and {"data", "shape"} <= set(members):  # scipy.sparse.save_npz's members
            try:
                return sp.load_npz(source), None
            except (*_UNREADABLE, KeyError) as error:
                raise DataError(f"{source!r} is a scipy.sparse archive that cannot be read: {error!r}") from None
        if len(members) != 1:
            raise DataError(f"{source!r} holds arrays {members}; save exactly one") from None
        try:
            return archive[members[0]], None
        except _UNREADABLE as error:
            raise DataError(f"{source!r}: its array {members[0]!r} cannot be read: {error}") from None


def _read_table(source):
    """
    A numeric .csv/.tsv/.txt table (commas, tabs; a .txt whose first line
    has no comma splits on whitespace, as numpy.savetxt writes), with an
    optional header row of names (a first row that is not all numbers).  A
    header whose first name is empty (pandas' ``to_csv`` with its index)
    marks a first column of row labels, left out.  A first row 0, 1, ..., G - 1 is data, with a warning: it may be
    the header pandas writes for an unnamed frame.  A byte-order mark (Excel's
    "CSV UTF-8") is not part of the first name.
    """
    try:
        with open(source, encoding="utf-8-sig") as stream:
            first = stream.readline().strip()
        extension = os.path.splitext(source)[1].lower()
        delimiter = "\t" if extension == ".tsv" else None if extension == ".txt" and "," not in first else ","
        header = [name.strip().strip('"').strip("'") for name in first.split(delimiter)]
    except UnicodeDecodeError as error:
        raise DataError(f"{source!r} is not UTF-8 text ({error.reason} at byte {error.start}); "
                        "is it a table?") from None
    trailing = False
    while len(header) > 1 and header[-1] == "":  # a trailing delimiter: its empty column is left out too
        header.pop()
        trailing = True
    try:
        [float(value) for value in header]
        is_header = False
        if header == [str(j) for j in range(len(header))]:
            warnings.warn(f"{source!r}: the first row, 0, 1, ..., {len(header) - 1}, is read as data; if it is "
                          "pandas' header of an unnamed frame, drop it (to_csv(..., header=False))", stacklevel=2)
    except ValueError:
        is_header = True
    labelled = is_header and len(header) > 1 and header[0] == ""
    names = (header[1:] if labelled else header) if is_header else None
    columns = range(int(labelled), len(header)) if labelled or trailing else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": reported below
            X = np.loadtxt(source, delimiter=delimiter, skiprows=int(is_header), ndmin=2, usecols=columns,
                           encoding="utf-8-sig")
    except ValueError as error:
        raise DataError(f"{source!r} is not a numeric table: {error}") from None
    if X.size == 0:
        raise DataError(f"{source!r} has no data rows")
    if names is not None and len(names) != X.shape[1]:
        raise DataError(f"{source!r} has {len(names)} names in its header but {X.shape[1]} columns of data")
    return X, names


def _read_h5ad(source):
    try:
        import anndata
    except ImportError:
        raise DataError(f"{source!r}: reading .h5ad files needs anndata (pip install anndata)") from None
    try:
        adata = anndata.read_h5ad(source)
    except (OSError, ValueError, KeyError, TypeError) as error:  # TypeError: an HDF5 file that is not an AnnData
        raise DataError(f"{source!r} is not a readable .h5ad file: {error}") from None
    return adata, list(adata.var_names)


READERS = {".npy": _read_npy, ".npz": _read_npz, ".csv": _read_table, ".txt": _read_table, ".tsv": _read_table,
           ".h5ad": _read_h5ad}


def read_data(source, n=1000, rho=0.6, seed=0):
    """(X, feature names or None, truth or None, default likelihood) for ``--data``."""
    if source == "synthetic":
        data = synthetic_sparse_dgm(n=n, rho=rho, seed=seed)
        return data.X, [f"x{j + 1}" for j in range(data.X.shape[1])], data, "gaussian"
    if source in REAL_DATA:
        data = REAL_DATA[source]()
        return data.X, list(data.feature_names), None, data.likelihood
    if os.path.isdir(source):
        raise DataError(f"--data {source!r} is a directory; give one file in it")
    if not os.path.isfile(source):
        raise DataError(f"--data {source!r}: no such file (or use 'synthetic', {', '.join(REAL_DATA)})")
    reader = READERS.get(os.path.splitext(source)[1].lower())
    if reader is None:
        raise DataError(
            f"--data {source!r}: use 'synthetic', {', '.join(REAL_DATA)} or a .csv, .tsv, .txt, .npy, .npz or "
            ".h5ad file"
        )
    X, names = reader(source)
    if isinstance(X, np.ndarray) and (X.ndim != 2 or X.dtype.names):
        kind = "a record array" if X.dtype.names else f"an array of shape {X.shape}"
        raise DataError(f"{source!r} holds {kind}; give a 2-D (points x features) array of numbers, e.g. "
                        "X.reshape(-1, 1) for one feature")
    return X, names, None, "gaussian"


def _mask(fitted):
    """The (G x K) loadings W: ssl_dgm's decoder mask or nmf's; None for the VAEs' (none) and oi_vae's (groups, K, p)."""
    try:
        W = fitted.W_
    except AttributeError:
        return None
    return W if W.ndim == 2 else None


def _has_ssl_prior(fitted):
    site_priors = getattr(getattr(fitted, "model", None), "site_priors", {})  # nmf has no Pyro model
    return _mask(fitted) is not None and "W" in site_priors and hasattr(site_priors["W"], "eta")


def _describe(fitted, names, heldout):
    """Lines reporting what was learned; ``heldout`` is fresh synthetic data with its truth, or None."""
    lines = []
    W = _mask(fitted)
    if W is not None:
        if hasattr(fitted, "active_factors_"):  # nmf uses all its factors
            lines.append(f"factors in use: {len(fitted.active_factors_)} of {W.shape[1]} (columns of W not exactly "
                         "zero)")
        if _has_ssl_prior(fitted):
            lines.append(f"eta (share of features per factor): {np.array2string(fitted.eta_, precision=3)}")
        if W.shape[0] <= 30:
            labels = names or [str(j) for j in range(W.shape[0])]
            lines.append("W (rows: features, columns: factors; 0 = feature does not use the factor):")
            width = max(len(str(label)) for label in labels)
            for label, row in zip(labels, W):
                lines.append(f"  {str(label):>{width}} " + " ".join(f"{v:7.3f}" for v in row))
        for k, top in enumerate(fitted.top_features(5, names)):
            if top:
                lines.append(f"  factor {k}: top features {top}")
    if heldout is not None:
        z = fitted.transform(heldout.X)
        lines.append(f"heldout MSE: {evaluation.mse(heldout.X, fitted.reconstruct(heldout.X)):.3f} (noise variance 0.5)")
        lines.append(f"heldout NLL per point: {evaluation.heldout_nll(fitted.heldout_log_likelihood(heldout.X, 50)):.3f}")
        lines.append(f"DCI disentanglement vs true factors: {evaluation.dci_disentanglement(z, heldout.z):.3f}")
        if W is not None and hasattr(fitted, "support_"):  # nmf's loadings have no support to score
            matching = evaluation.match_factors(z, heldout.z)
            score = evaluation.support_f_score(fitted.support_, heldout.support, matching)
            lines.append(f"F-score of the support of W vs the truth: {score:.3f}")
    return lines


def _image_shape(args, num_features):
    """``--image-shape height,width`` checked before training, or None."""
    if args.image_shape is None:
        return None
    if not isinstance(MODELS[args.model], SVIModel):
        raise ValueError(f"--image-shape draws latent traversals through a decoder, which {args.model} does not have")
    sizes = args.image_shape.split(",")
    shape = tuple(int(size) for size in sizes) if all(size.strip().isdigit() for size in sizes) else ()
    if len(shape) != 2 or shape[0] * shape[1] != num_features:
        raise DataError(
            f"--image-shape {args.image_shape!r}: give height,width with height * width = {num_features} features"
        )
    return shape


def _figures(fitted, X, names, image_shape):
    """The figures that apply to ``fitted``, by file name (needs matplotlib)."""
    from pyro_sparse.interop import plots

    figures = {"loss.png": plots.loss_curve(fitted.history_)}
    W = _mask(fitted)
    if W is not None:
        figures["W.png"] = plots.mask_heatmap(W, names)
        if np.any(W):
            figures["top_features.png"] = plots.top_features(W, 10, names)
    codes = fitted.transform(X)
    in_use = getattr(fitted, "active_factors_", slice(None))  # nmf uses all its factors
    if np.any(codes[:, in_use] == 0):  # sparse codes (vsc, tvsc, nmf), not factors switched off
        figures["sparsity.png"] = plots.sparsity_histograms(codes)
    if image_shape is not None:
        figures["traversal.png"] = plots.latent_traversal(fitted, X[:1], image_shape)
    return figures


def _checkpointing(args):
    """The model's own Checkpointing (tvsc rolls back divergences) with the command line's files; None without."""
    if args.checkpoint is None and args.resume is None and args.on_divergence is None:
        return None
    default = training_defaults(args.model).get("checkpointing", Checkpointing())
    chosen = {} if args.on_divergence is None else {"on_divergence": args.on_divergence}
    return dataclasses.replace(default, path=args.checkpoint, resume_from=args.resume, **chosen)


def _fit(args, X, default_likelihood):
    """``train`` with the command line's settings."""
    hyper = dict(args.option)
    for key in ("lambda0", "lambda1", "beta", "latent_prior", "mask_prior"):
        if getattr(args, key) is not None:
            hyper[key] = getattr(args, key)
    for key in ("hidden_dims", "encoder_hidden_dims"):
        if getattr(args, key):
            hyper[key] = getattr(args, key)
    return train(
        args.model, X, layer=args.layer, batch_key=args.batch_key, latent_dim=args.latent_dim,
        likelihood=args.likelihood or default_likelihood, max_epochs=args.epochs, batch_size=args.batch_size,
        lr=args.lr, seed=args.seed, device=args.device, progress=not args.quiet,
        schedule=Schedule(validation_fraction=args.validation_fraction, kl_warmup_epochs=args.kl_warmup_epochs),
        checkpointing=_checkpointing(args),
        hardware=Hardware(precision=args.precision, strategy=args.strategy),
        **hyper,
    )


def _write_summary(args, fitted, lines):
    summary = {
        "model": args.model,
        "data": args.data,
        "config": {k: v for k, v in fitted.config.items() if k != "feature_variances"},
        "final_train_loss": fitted.history_["train_loss"][-1],
        "report": lines,
    }
    if _mask(fitted) is not None:
        summary["W"] = fitted.W_.tolist()
    if _has_ssl_prior(fitted):
        summary.update(eta=fitted.eta_.tolist(), inclusion_probs=fitted.inclusion_probs_.tolist())
    with open(os.path.join(args.out, "summary.json"), "w") as stream:
        json.dump(summary, stream, indent=2)
    return summary


def _train(args):
    X, names, truth, default_likelihood = read_data(args.data, args.n, args.rho, args.seed)
    image_shape = _image_shape(args, X.shape[1])
    try:  # before training: a bad --out must not cost a run
        os.makedirs(args.out, exist_ok=True)
        serialization.check_writable(os.path.join(args.out, "model.pt"))
    except OSError as error:
        raise DataError(f"--out {args.out!r}: cannot write there ({error.strerror or error})") from None
    data = X
    if names is not None and isinstance(X, np.ndarray):
        import pandas

        data = pandas.DataFrame(X, columns=[str(name) for name in names])  # the model keeps the names
    try:
        fitted = _fit(args, data, default_likelihood)
    except TrainingDivergedError as error:
        if getattr(error, "fitted", None) is None or not distributed.is_main_process():
            raise
        path = os.path.join(args.out, "model_at_divergence.pt")  # not model.pt: the run did not finish
        error.fitted.save(path)
        raise TrainingDivergedError(f"{error}; that model is saved in {path}", error.history, error.reason) from None
    if not distributed.is_main_process():
        return  # every rank ends with the same model; rank 0 reports and writes it
    fitted.save(os.path.join(args.out, "model.pt"))
    heldout = None if truth is None else synthetic_sparse_dgm(n=args.n, rho=args.rho, seed=args.seed + 10_000)
    lines = _describe(fitted, names, heldout)
    summary = _write_summary(args, fitted, lines)
    written = ["model.pt", "summary.json"]
    try:
        import matplotlib.pyplot as plt

        for name, figure in _figures(fitted, X, names, image_shape).items():
            figure.savefig(os.path.join(args.out, name), dpi=120)
            plt.close(figure)  # written: an in-process caller (tests, a notebook) is not left holding it
            written.append(name)
    except ImportError as error:
        lines.append(f"(no figures: {error})")
    print(f"trained {args.model} on {args.data}: {fitted.num_features} features, final loss {summary['final_train_loss']:.3f}")
    print("\n".join(lines))
    print(f"wrote {', '.join(written)} to {args.out}")


def _option(text):
    """``--option KEY=VALUE``: a model hyperparameter; VALUE is read as JSON (a number, true, null, ...) or a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip().isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r}: give KEY=VALUE, e.g. alpha=0.3")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def _widths(text):
    """``--hidden-dims``: comma-separated positive layer widths."""
    widths = tuple(int(width) for width in text.split(",") if width.strip().isdigit())
    if len(widths) != len(text.split(",")) or not all(widths):
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated positive widths, e.g. 50,50,50")
    return widths


def build_parser():
    parser = argparse.ArgumentParser(prog="pyro-sparse", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    fit = commands.add_parser("train", help="fit a model and write it, a JSON summary and figures")
    fit.add_argument(
        "--model", default="ssl_dgm", choices=sorted(MODELS),
        help="; ".join(f"{name}: {entry.summary}" for name, entry in sorted(MODELS.items())),
    )
    fit.add_argument(
        "--data", default="synthetic",
        help=f"'synthetic' (Moran et al. Eq. 9), a real data set ({', '.join(REAL_DATA)}; "
        "see pyro_sparse.data.real) or a .csv/.tsv/.txt/.npy/.npz/.h5ad file",
    )
    fit.add_argument(
        "--likelihood", default=None, choices=list(LIKELIHOODS),
        help="default: the data set's for a real data set (e.g. negative_binomial for cell counts), else gaussian",
    )
    fit.add_argument("--latent-dim", type=int, default=5)
    fit.add_argument("--hidden-dims", type=_widths, default=None,
                     help="comma-separated widths of the decoder's hidden layers (and the encoder's), e.g. 50,50,50")
    fit.add_argument("--encoder-hidden-dims", type=_widths, default=None,
                     help="the encoder's widths, if not those of --hidden-dims")
    fit.add_argument("--epochs", type=int, default=200)
    fit.add_argument("--batch-size", type=int, default=100)
    fit.add_argument("--lr", type=float, default=None, help="default: the model's (0.01; tvsc 1e-3)")
    fit.add_argument("--seed", type=int, default=0)
    fit.add_argument("--lambda0", type=float, default=None)
    fit.add_argument("--lambda1", type=float, default=None)
    fit.add_argument("--beta", type=float, default=None)
    fit.add_argument("--validation-fraction", type=float, default=0.0)
    fit.add_argument("--kl-warmup-epochs", type=float, default=None,
                     help="epochs over which the codes' KL weight rises to 1 (default: a quarter of --epochs)")
    fit.add_argument("--device", default="auto")
    fit.add_argument(
        "--precision", default="fp32", choices=["fp32", "bf16", "tf32"],
        help="bf16: decoder networks in bfloat16 (CPU or CUDA); tf32: TensorFloat-32 matmuls (CUDA only)",
    )
    fit.add_argument(
        "--strategy", default=None, choices=["ddp"],
        help="ddp: data-parallel over the processes torchrun starts "
        "(torchrun --nproc_per_node=N -m pyro_sparse train --strategy ddp ...); --batch-size is the global batch",
    )
    fit.add_argument("--latent-prior", default=None, choices=sorted(LATENT_PRIORS), help="prior of the codes z")
    fit.add_argument("--mask-prior", default=None, choices=sorted(MASK_PRIORS), help="prior of ssl_dgm's mask W")
    fit.add_argument(
        "--option", type=_option, action="append", default=[], metavar="KEY=VALUE",
        help="any other hyperparameter of the model or its priors (repeatable), e.g. --option alpha=0.3",
    )
    fit.add_argument("--layer", default=None, help="for an .h5ad file: fit adata.layers[LAYER] instead of adata.X")
    fit.add_argument("--batch-key", default=None,
                     help="for an .h5ad file: an adata.obs column of batches, a covariate rather than a factor")
    fit.add_argument("--checkpoint", default=None, help="save the training state to this file every epoch")
    fit.add_argument("--resume", default=None, help="go on from a checkpoint file written by --checkpoint")
    fit.add_argument("--on-divergence", default=None, choices=("raise", "rollback"),
                     help="on a NaN or spiking loss: stop (saving the last good epoch's model), or roll back to it "
                          "with halved learning rates and go on (default: the model's; tvsc rolls back)")
    # Not "--n" alone: torchrun reads an abbreviation of its own options (--nnodes, ...) in the script's arguments.
    fit.add_argument("--num-points", "--n", dest="n", type=int, default=1000, help="data points for --data synthetic")
    fit.add_argument("--rho", type=float, default=0.6, help="factor correlation for --data synthetic")
    fit.add_argument("--out", default="pyro-sparse-output")
    fit.add_argument("--quiet", action="store_true", help="no progress bar")
    fit.add_argument(
        "--image-shape", default=None,
        help="height,width of each data point as an image: also writes latent traversals (traversal.png)",
    )
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        _train(args)
    except (
        DataError, DatasetNotInstalledError, ValueError, TypeError, TrainingDivergedError, DecoderMemoryError, OSError
    ) as error:
        print(f"pyro-sparse: error: {_in_cli_words(str(error))}", file=sys.stderr)
        return 2
    except MemoryError as error:  # e.g. a file that declares a far larger matrix than it holds
        print(f"pyro-sparse: error: out of memory ({error}); check the data's shape, or lower --batch-size",
              file=sys.stderr)
        return 2
    return 0


# train()'s advice in errors, as the command line's options.
_CLI_WORDS = [
    (re.compile(r"checkpointing=Checkpointing\(on_divergence='rollback'\)"), "--on-divergence rollback"),
    (re.compile(r"schedule=Schedule\(kl_warmup_epochs=([^)]*)\)"), r"--kl-warmup-epochs \1"),
    (re.compile(r"layer=None uses adata\.X"), "without --layer adata.X is fitted"),
    (re.compile(r"mask_prior='gene_sets' needs gene_sets= \(.*\)$"),
     "--mask-prior gene_sets needs --option gene_sets=FILE.gmt (a .gmt file of gene sets)"),
]


def _in_cli_words(message):
    for pattern, words in _CLI_WORDS:
        message = pattern.sub(words, message)
    return message


if __name__ == "__main__":
    sys.exit(main())
