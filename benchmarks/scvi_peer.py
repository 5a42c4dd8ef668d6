"""
The peer to beat (issue 19): scvi-tools' SCVI and LinearSCVI on the same cells
and split as ``single_cell_counts.py``.  Run by that script with the Python of
a separate environment holding scvi-tools (never a dependency of pyro_sparse):

    python -m venv /tmp/scvi-venv && /tmp/scvi-venv/bin/pip install torch==2.13.0 scvi-tools==1.4.2
    python benchmarks/single_cell_counts.py --scvi-python /tmp/scvi-venv/bin/python

Reads an .h5ad with ``layers["counts"]`` and ``obs`` columns ``split``
(train/test), ``cell_type`` and optionally ``batch``; prints one JSON object
with the test cells' latent means (``codes``), scored by the calling script
with the same linear probe as its own models.
"""

import json
import sys
import time

import anndata
import numpy as np
import scvi
import torch


def fit(cls, adata, epochs, seed, batch_key=None, **options):
    scvi.settings.seed = seed
    cls.setup_anndata(adata, layer="counts", batch_key=batch_key)
    model = cls(adata, n_latent=10, **options)
    start = time.process_time()
    model.train(max_epochs=epochs, train_size=1.0, accelerator="cpu", enable_progress_bar=False)
    return model, time.process_time() - start


def evaluate(model, adata, test, seconds, **extra):
    codes = model.get_latent_representation(adata, indices=test)
    return {"heldout_ll": float(model.get_marginal_ll(adata, indices=test, n_mc_samples=50)),
            "codes": codes.tolist(), "seconds": seconds, **extra}


def main():
    path, epochs, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    data = anndata.read_h5ad(path)
    train = data[data.obs["split"] == "train"].copy()
    test_all = np.flatnonzero(data.obs["split"].to_numpy() == "test")
    batch_key = "batch" if "batch" in data.obs else None
    results = {}
    likelihoods = ("nb",) if batch_key else ("nb", "zinb", "poisson")
    for likelihood in likelihoods:
        model, seconds = fit(scvi.model.SCVI, train, epochs, seed, batch_key, gene_likelihood=likelihood)
        results[f"SCVI {likelihood}"] = evaluate(model, data, test_all, seconds)
    if not batch_key:
        model, seconds = fit(scvi.model.LinearSCVI, train, epochs, seed, gene_likelihood="nb")
        loadings = model.get_loadings().to_numpy()
        small = float(np.mean(np.abs(loadings) < 0.01 * np.abs(loadings).max()))
        results["LinearSCVI nb"] = evaluate(model, data, test_all, seconds, loadings_below_1pc_of_max=small)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
