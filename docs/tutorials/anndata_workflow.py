"""
Tutorial: the sparse VAE on single-cell counts in an AnnData (scanpy's and
scvi-tools' container): register the raw counts and the batch once, fit with
a negative binomial likelihood, read factors as gene lists, remove the batch
effect at decode time, write codes and loadings back, and evaluate new cells.

The cells here are simulated so the tutorial runs offline and the truth is
known: 600 cells from two batches, 30 genes in three programs of ten genes
each, each program on in a cell with probability 1/2, and a gene-wise batch shift.
Swap in ``anndata.read_h5ad("cells.h5ad")`` for real data.

    python docs/tutorials/anndata_workflow.py
"""

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp

import pyro_sparse
from pyro_sparse.io.anndata import setup_anndata

# --- simulated counts: program p raises the expression of genes 10p..10p+9;
# batch b1 scales every gene by its own factor (a technical effect, not biology).
rng = np.random.default_rng(0)
num_cells, num_programs, genes_per_program = 600, 3, 10
activity = rng.gamma(2.0, 1.0, size=(num_cells, num_programs)) * (rng.random((num_cells, num_programs)) < 0.5)
loadings = np.kron(np.eye(num_programs), np.ones((1, genes_per_program)))  # programs x genes, block diagonal
batch = rng.random(num_cells) < 0.5
shift = np.exp(rng.normal(0.0, 0.5, size=num_programs * genes_per_program))
rates = (1.0 + 20.0 * activity @ loadings) * np.where(batch[:, None], shift, 1.0)
counts = rng.negative_binomial(5, 5 / (5 + rates))
counts[counts.sum(1) == 0, 0] = 1
genes = [f"P{p}_gene{g}" for p in range(num_programs) for g in range(genes_per_program)]

# The usual layout: raw counts in a (sparse) layer, normalised values in X.
adata = anndata.AnnData(
    X=np.log1p(counts / counts.sum(1, keepdims=True) * 1e4).astype(np.float32),
    obs=pd.DataFrame({"batch": pd.Categorical(np.where(batch, "b1", "b0"))},
                     index=[f"cell{i}" for i in range(num_cells)]),
    var=pd.DataFrame(index=genes),
)
adata.layers["counts"] = sp.csr_matrix(counts)

# --- register once (scvi-tools' convention): the counts layer and the batch,
# a covariate of encoder and decoder rather than a factor.
setup_anndata(adata, layer="counts", batch_key="batch")
train, new = adata[:500].copy(), adata[500:].copy()

# --- fit: negative binomial counts with each cell's total as the library size.
# A sparse layer is never densified whole: one minibatch at a time.  Table 6's
# three decoder layers (the count default is one, faster) prune W further.
fitted = pyro_sparse.train(
    "ssl_dgm", train, likelihood="negative_binomial", latent_dim=5, hidden_dims=(50, 50, 50), max_epochs=200,
    seed=0, progress=False,
)

# --- factors as gene lists: the var_names were kept with the model.  Each
# program should show up as factors whose top genes come from it alone.
for k, top in enumerate(fitted.top_features(4)):
    if top:  # factors the SSL prior switched off have no genes
        print(f"factor {k}: {top}")
print(fitted.loadings().head())  # one row per non-zero W_jk, with E[γ_jk]

# --- denoised expression with the batch effect removed: decode every cell as if from batch b0.
expression = fitted.get_normalized_expression(train, batch="b0", library_size=1e4)
print("normalized expression:", expression.shape, "rows sum to", expression.sum(1)[:2].round(1))

# --- write back: codes in obsm, W and its inclusion probabilities in varm.
fitted.write_to(train)
print("obsm:", list(train.obsm), " varm:", list(train.varm))
# With scanpy installed, the codes are an embedding like any other:
#   scanpy.pp.neighbors(train, use_rep="X_ssl_dgm"); scanpy.tl.umap(train)

# --- new cells: the model reads the layer and the covariates it was trained on,
# and checks that the genes are the training genes in the training order.
shuffled = new[:, list(reversed(genes))]
try:
    fitted.transform(shuffled)
except ValueError as error:  # a pyro_sparse.data.DataError
    print("refused:", str(error)[:90], "...")
codes = fitted.get_latent_representation(shuffled[:, fitted.config["feature_names"]])
print("codes of the new cells:", codes.shape)
print(f"heldout log-likelihood per new cell: {fitted.heldout_log_likelihood(new, num_samples=20).mean():.1f}")

# --- files: the model (tensors + JSON) and the annotated AnnData.
fitted.save("cells_model.pt")
train.write_h5ad("cells_annotated.h5ad")
again = pyro_sparse.load("cells_model.pt")
print("reloaded, same codes:", np.allclose(again.transform(new), fitted.transform(new)))
