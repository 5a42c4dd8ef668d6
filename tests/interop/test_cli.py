"""The pyro-sparse command line."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from pyro_sparse.interop.cli import build_parser, main, read_data

QUICK = ["--epochs", "2", "--latent-dim", "3", "--hidden-dims", "8,8", "--quiet"]


def test_train_on_synthetic_writes_model_summary_and_figures(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--model", "ssl_dgm", "--data", "synthetic", "--n", "200", "--out", str(out), *QUICK]) == 0
    assert {p.name for p in out.iterdir()} == {"model.pt", "summary.json", "loss.png", "W.png", "top_features.png"}
    summary = json.loads((out / "summary.json").read_text())
    assert np.asarray(summary["W"]).shape == (7, 3)
    assert len(summary["eta"]) == 3
    printed = capsys.readouterr().out
    assert "DCI disentanglement" in printed and "F-score" in printed and "x7" in printed
    import pyro_sparse

    assert pyro_sparse.load(out / "model.pt").W_.shape == (7, 3)


@pytest.mark.parametrize("model", ["vae", "vsc", "tvsc", "oi_vae", "nmf"])
def test_every_registered_model_trains_from_the_command_line(tmp_path, model):
    X = np.abs(np.random.default_rng(0).normal(size=(60, 5)))
    np.save(tmp_path / "data.npy", X)
    out = tmp_path / "run"
    options = [o for o in QUICK if o not in ("--hidden-dims", "8,8")] if model == "nmf" else QUICK  # NMF has no network
    assert main(["train", "--model", model, "--data", str(tmp_path / "data.npy"), "--out", str(out), *options]) == 0
    assert {"model.pt", "summary.json"} <= {p.name for p in out.iterdir()}
    import pyro_sparse

    assert pyro_sparse.load(out / "model.pt").transform(X).shape == (60, 3)
    if model == "nmf":  # loadings without a mask prior: reported and saved too
        summary = json.loads((out / "summary.json").read_text())
        assert np.asarray(summary["W"]).shape == (5, 3) and "W.png" in {p.name for p in out.iterdir()}
        assert any("top features" in line for line in summary["report"])


@pytest.mark.parametrize("kind", ["csv", "csv-header", "csv-bom", "csv-trailing", "txt", "txt-commas", "npy",
                                  "npz-sparse", "npz-dense"])
def test_reads_user_files(tmp_path, kind):
    X = np.random.default_rng(0).normal(size=(60, 4))
    path = tmp_path / f"data.{kind.split('-')[0]}"
    if kind == "csv":
        np.savetxt(path, X, delimiter=",")
    elif kind == "csv-header":
        np.savetxt(path, X, delimiter=",", header="a,b,c,d", comments="")
    elif kind == "csv-bom":  # Excel's "CSV UTF-8": a byte-order mark before the first value
        np.savetxt(path, X, delimiter=",", encoding="utf-8-sig")
    elif kind == "csv-trailing":  # a delimiter at the end of every line
        path.write_text("\n".join(",".join(map(repr, row)) + "," for row in X.tolist()) + "\n")
    elif kind == "txt":  # numpy.savetxt's default: spaces
        np.savetxt(path, X)
    elif kind == "txt-commas":
        np.savetxt(path, X, delimiter=",")
    elif kind == "npy":
        np.save(path, X)
    elif kind == "npz-sparse":
        sp.save_npz(path, sp.csr_matrix(np.abs(X)))
    else:
        np.savez(path, X=X)
    out = tmp_path / "run"
    assert main(["train", "--model", "vae", "--data", str(path), "--out", str(out), *QUICK]) == 0
    assert (out / "model.pt").exists()
    read = read_data(str(path))[0]
    np.testing.assert_allclose(read.toarray() if sp.issparse(read) else read, np.abs(X) if kind == "npz-sparse" else X)


def _damaged(path, offset):
    content = bytearray(path.read_bytes())
    content[offset] ^= 0xFF
    path.write_bytes(bytes(content))


BAD_FILES = {
    "one-d.npy": (lambda p: np.save(p, np.arange(10.0)), "holds an array of shape (10,); give a 2-D"),
    "record.npy": (lambda p: np.save(p, np.zeros(3, dtype=[("a", float), ("b", float)])), "holds a record array"),
    "empty.npy": (lambda p: p.write_bytes(b""), "is not an array written by numpy.save"),
    "archive.npy": (lambda p: np.savez(open(p, "wb"), a=np.ones((3, 2))), "is an archive of arrays (numpy.savez)"),
    "damaged.npz": (lambda p: (np.savez(p, a=np.ones((30, 4))), _damaged(p, 300)), "its array 'a' cannot be read"),
    "damaged-sparse.npz": (lambda p: (sp.save_npz(p, sp.csr_matrix(np.ones((30, 4))), compressed=False),
                                      _damaged(p, 300)), "is a scipy.sparse archive that cannot be read"),
    "latin1.csv": (lambda p: p.write_bytes("é,1\n2,3\n".encode("latin-1")), "is not UTF-8 text"),
}


def test_running_out_of_memory_is_a_message(tmp_path, capsys, monkeypatch):
    # E.g. a sparse file that declares 10^13 columns: whether numpy's allocation fails, and where, depends on the
    # machine, so the failure is made here.
    def too_large(*args, **kwargs):
        raise MemoryError("Unable to allocate 7.28 TiB for an array with shape (1000000000000,)")

    monkeypatch.setattr("pyro_sparse.interop.cli._fit", too_large)
    assert main(["train", "--n", "60", "--out", str(tmp_path / "run"), *QUICK]) == 2
    assert "out of memory (Unable to allocate 7.28 TiB" in capsys.readouterr().err


@pytest.mark.parametrize("name", BAD_FILES)
def test_damaged_or_unexpected_files_are_named(tmp_path, capsys, name):
    write, message = BAD_FILES[name]
    path = tmp_path / name
    write(path)
    assert main(["train", "--data", str(path), "--out", str(tmp_path / "run"), *QUICK]) == 2
    assert message in capsys.readouterr().err


def test_tables_written_by_pandas_are_read_with_their_names(tmp_path):
    # pandas writes its index first, under an empty name: not a feature; the names stay with the model.
    pandas = pytest.importorskip("pandas")
    X = np.random.default_rng(0).normal(size=(60, 4))
    import pyro_sparse

    pandas.DataFrame(X, columns=list("abcd")).to_csv(tmp_path / "data.csv")
    assert main(["train", "--model", "vae", "--data", str(tmp_path / "data.csv"), "--out", str(tmp_path / "a"),
                 *QUICK]) == 0
    fitted = pyro_sparse.load(tmp_path / "a" / "model.pt")
    assert (fitted.config["num_data"], fitted.config["feature_names"]) == (60, list("abcd"))
    # A first row 0, 1, ... may be data (binary, counts) or an unnamed frame's header: kept, with a warning.
    pandas.DataFrame(X).to_csv(tmp_path / "unnamed.csv", index=False)
    with pytest.warns(UserWarning, match="0, 1, ..., 3, is read as data"):
        assert main(["train", "--model", "vae", "--data", str(tmp_path / "unnamed.csv"), "--out",
                     str(tmp_path / "b"), *QUICK]) == 0
    assert pyro_sparse.load(tmp_path / "b" / "model.pt").config["num_data"] == 61


def test_the_command_line_keeps_the_models_training_defaults(tmp_path):
    # tvsc trains at lr 1e-3 and rolls back divergences unless told otherwise, from the command line too.
    np.save(tmp_path / "data.npy", np.random.default_rng(0).normal(size=(60, 5)))
    out = tmp_path / "run"
    arguments = ["train", "--model", "tvsc", "--data", str(tmp_path / "data.npy"), "--out", str(out), *QUICK]
    assert main([*arguments, "--checkpoint", str(tmp_path / "run.ckpt")]) == 0
    import pyro_sparse
    from pyro_sparse.infer import checkpoints
    from pyro_sparse.io import serialization

    assert pyro_sparse.load(out / "model.pt").config["training"]["lr"] == 1e-3
    run = serialization.read(tmp_path / "run.ckpt", checkpoints.CHECKPOINT_FILE)[0]["run"]
    assert run["training"]["lr"] == 1e-3
    # The rollback on divergence is not recorded in the files: read the settings the command line passes.
    from pyro_sparse.interop.cli import _checkpointing, build_parser

    args = build_parser().parse_args([*arguments, "--checkpoint", str(tmp_path / "run.ckpt")])
    assert (_checkpointing(args).on_divergence, _checkpointing(args).path) == ("rollback", str(tmp_path / "run.ckpt"))
    assert _checkpointing(build_parser().parse_args(arguments)) is None  # train's own default then


def test_bad_input_exits_with_a_message(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("1,2\n3,nan\n")
    assert main(["train", "--data", str(bad), "--out", str(tmp_path / "run"), *QUICK]) == 2
    assert "NaN or infinite" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path / "missing.csv"), *QUICK]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["train", "--data", str(tmp_path), *QUICK]) == 2
    assert "is a directory; give one file in it" in capsys.readouterr().err
    # An --out that cannot be written is named before any training.
    assert main(["train", "--n", "60", "--out", str(bad / "run"), *QUICK]) == 2
    assert f"--out {str(bad / 'run')!r}: cannot write there" in capsys.readouterr().err
    # train's advice in the command line's words.
    assert main(["train", "--n", "60", "--mask-prior", "gene_sets", "--out", str(tmp_path / "run"), *QUICK]) == 2
    assert "--mask-prior gene_sets needs --option gene_sets=FILE.gmt" in capsys.readouterr().err
    anndata = pytest.importorskip("anndata")
    anndata.AnnData(np.ones((20, 4), np.float32)).write_h5ad(tmp_path / "cells.h5ad")
    assert main(["train", "--data", str(tmp_path / "cells.h5ad"), "--layer", "count", *QUICK]) == 2
    assert "no layer 'count' (it has []); without --layer adata.X is fitted" in capsys.readouterr().err


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "pyro-sparse"
    out = subprocess.run([str(script), "train", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--latent-dim" in out.stdout


def test_priors_options_and_checkpoints_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train", "--model", "ssl_dgm", "--data", "synthetic", "--n", "100", "--out", str(out), *QUICK]
    prior = ["--latent-prior", "spike_slab", "--option", "alpha=0.3", "--mask-prior", "horseshoe"]
    assert main([*args, *prior, "--checkpoint", str(tmp_path / "run.ckpt")]) == 0  # QUICK: 2 epochs
    config = json.loads((out / "summary.json").read_text())["config"]["hyperparameters"]
    assert (config["latent_prior"], config["alpha"], config["mask_prior"]) == ("spike_slab", 0.3, "horseshoe")
    assert (tmp_path / "run.ckpt").is_file()
    # Resuming with the same arguments and more epochs goes on from the checkpoint, once the KL warm-up keeps
    # the length it had (a quarter of the first run's 2 epochs).
    capsys.readouterr()
    assert main([*args, *prior, "--epochs", "3", "--resume", str(tmp_path / "run.ckpt")]) == 2
    assert "--kl-warmup-epochs 0.5" in capsys.readouterr().err  # train's advice in the command line's words
    assert main([*args, *prior, "--epochs", "3", "--kl-warmup-epochs", "0.5", "--resume",
                 str(tmp_path / "run.ckpt")]) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["training"]["max_epochs"] == 3
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main([*args, "--option", "alpha"])
    assert "give KEY=VALUE" in capsys.readouterr().err
    # alpha belongs to the spike-and-slab prior, not to the default Gaussian one.
    assert main([*args, "--option", "alpha=0.3"]) == 2
    assert "no option(s) ['alpha']" in capsys.readouterr().err


def test_a_diverged_run_keeps_its_last_good_model(tmp_path, capsys, monkeypatch):
    from pyro_sparse.infer import loop

    original = loop.Trainer._check_finite

    def nan_in_the_third_epoch(self, tensors, what):
        if self.loop.epoch == 2:
            raise self._diverged(f"{what} became NaN/inf")
        return original(self, tensors, what)

    monkeypatch.setattr(loop.Trainer, "_check_finite", nan_in_the_third_epoch)
    out = tmp_path / "run"
    args = ["train", "--model", "vae", "--n", "60", "--batch-size", "20", "--out", str(out), *QUICK, "--epochs", "4"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "or pass --on-divergence rollback" in error and f"saved in {out / 'model_at_divergence.pt'}" in error
    import pyro_sparse

    assert len(pyro_sparse.load(out / "model_at_divergence.pt").history_["train_loss"]) == 2
    assert not (out / "model.pt").exists()
    from pyro_sparse.interop.cli import _checkpointing, build_parser

    assert _checkpointing(build_parser().parse_args([*args, "--on-divergence", "rollback"])).on_divergence == "rollback"


def test_every_train_option_passes_through_torchrun():
    # torchrun's parser takes an abbreviation of its own options (--n for --nnodes,
    # ...) out of the script's arguments; the docs launch `-m pyro_sparse train` under it.
    from torch.distributed.run import get_args_parser

    fit = build_parser()._subparsers._group_actions[0].choices["train"]
    options = [action.option_strings[0] for action in fit._actions if action.option_strings[0] != "-h"]
    for option in options:
        launched = ["--standalone", "--nproc-per-node=2", "-m", "pyro_sparse", "train", option, "1"]
        assert get_args_parser().parse_args(launched).training_script_args == ["train", option, "1"], option
