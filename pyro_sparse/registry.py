"""
Models by name: ``train(model=NAME)`` looks the name up here.

Adding a model is a model file in ``models/``, a guide file in ``guides/``
when its latent prior needs a new guide family, and one line below.  An
entry is either an :class:`~pyro_sparse.svi.SVIModel` (a Pyro model fitted
by SVI) or any object with the same ``summary``, ``likelihoods``,
``option_names``, ``fit`` and ``load`` (``nmf``, fitted by scikit-learn), and a
``check_likelihood`` that names a likelihood outside ``likelihoods`` before the
data are checked against it; a ``fit`` that takes
``keywords`` gets ``train``'s own argument names, to offer where an unknown
option misspells one.
"""

from pyro_sparse.baselines.nmf import NMF
from pyro_sparse.infer.config import Checkpointing, Optimization
from pyro_sparse.models import OIVAE, TVSC, VAE, VSC, SparseDGM
from pyro_sparse.svi import SVIModel

# Thresholded codes at the unit scale of these models' own codes (N(0, I), VSC's slab N(0, 1)), with the prior's
# threshold learned per code (empirical Bayes) wherever the user's other options allow it, where the prior classes
# keep Fallah & Rozell's patch settings (b0 = 0.1) for tvsc (docs/results/tvsc.rst, "Thresholded codes inside the
# sparse VAE").
UNIT_SCALE_THRESHOLDED = {
    "thresholded_laplace": {"prior_scale": 1.0, "threshold": 1.0, "learn_prior_threshold": None, "kl": "augmented"},
    "thresholded_normal": {"prior_scale": 1.0, "threshold": 1.0, "learn_prior_threshold": None},
}

#: Registered models by name: the values ``train(model=...)`` accepts.
MODELS = {
    # For counts (poisson, NB, ZINB), a decoder of one hidden layer (scVI's depth) behind Table 6's three-layer
    # encoder: on CITE-seq half the time and higher cell-type accuracy than three decoder layers, at a denser W
    # (docs/results/single_cell.rst, "Count defaults").
    "ssl_dgm": SVIModel(SparseDGM, "sparse VAE with a Spike-and-Slab Lasso decoder mask (Moran et al. 2022)",
                        mask_prior="ssl", prior_defaults=UNIT_SCALE_THRESHOLDED,
                        count_networks={"hidden_dims": (50,), "encoder_hidden_dims": (50, 50, 50)}),
    "vae": SVIModel(VAE, "VAE / beta-VAE with a dense decoder (Kingma & Welling 2014; Higgins et al. 2017)",
                    prior_defaults=UNIT_SCALE_THRESHOLDED),
    "vsc": SVIModel(VSC, "variational sparse coding: spike-and-slab codes (Tonolini et al. 2019/2020)",
                    latent_prior="spike_slab", prior_defaults=UNIT_SCALE_THRESHOLDED),
    # A linear dictionary learns ~50x faster than the encoder (Fallah & Rozell, Appendix D: 0.5 vs 1e-2 with
    # SGD; here Adam, 0.1 vs 1e-3); at train's lr = 0.01 the encoder diverges
    # (benchmarks/results/sparse_coding_patches.md).
    "tvsc": SVIModel(TVSC, "thresholded variational sparse coding: soft-thresholded Laplace/Gaussian codes "
                     "(Fallah & Rozell 2022)", latent_prior="thresholded_laplace",
                     training_defaults={"lr": 1e-3, "optimization": Optimization(global_lr=0.1, lr_decay=0.99),
                                        "checkpointing": Checkpointing(on_divergence="rollback", spike_factor=10.0)}),
    "oi_vae": SVIModel(OIVAE, "output-interpretable VAE: group-lasso latent-to-group maps, one generator per group "
                       "(Ainsworth et al. 2018)", prior_defaults=UNIT_SCALE_THRESHOLDED),
    "nmf": NMF(),
}


def training_defaults(name):
    """The settings ``train`` uses for model ``name`` where it is given None: lr 0.01, else the model's own."""
    return {"lr": 0.01, **getattr(get_entry(name), "training_defaults", {})}


def get_entry(name):
    """The registry entry of model ``name``, or a ValueError listing the registered ones."""
    if not isinstance(name, str):
        raise TypeError(f"the model is named by a string, one of {sorted(MODELS)}, got a {type(name).__name__}; "
                        "the data go second: train(model, data)")
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; registered models: {sorted(MODELS)}")
    return MODELS[name]
