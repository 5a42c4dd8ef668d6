"""Metrics of fitted models; every function takes numpy arrays (diagnostics: :mod:`pyro_sparse.evaluation.diagnostics`)."""

from pyro_sparse.evaluation.classification import linear_probe_accuracy
from pyro_sparse.evaluation.collapse import (
    feature_collapse,
    gradient_snr,
    posterior_collapse,
)
from pyro_sparse.evaluation.dictionary import (
    SparseCodingReport,
    code_density,
    coherence,
    dead_atoms,
    dictionary_grid,
    sparse_coding_report,
)
from pyro_sparse.evaluation.disentanglement import (
    dci_disentanglement,
    dci_from_importance,
    importance_matrix,
    match_factors,
    multi_information,
)
from pyro_sparse.evaluation.likelihood import (
    heldout_nll,
    mse,
)
from pyro_sparse.evaluation.ranking import (
    hide_items,
    ndcg_at_k,
    recall_at_k,
)
from pyro_sparse.evaluation.stability import (
    FactorStability,
    active_factors,
    code_stability,
    factor_stability,
)
from pyro_sparse.evaluation.support import (
    support_f_score,
    support_jaccard,
)

__all__ = [
    "SparseCodingReport",
    "code_density",
    "coherence",
    "dead_atoms",
    "dictionary_grid",
    "sparse_coding_report",
    "FactorStability",
    "active_factors",
    "code_stability",
    "factor_stability",
    "dci_disentanglement",
    "dci_from_importance",
    "feature_collapse",
    "gradient_snr",
    "heldout_nll",
    "hide_items",
    "importance_matrix",
    "linear_probe_accuracy",
    "match_factors",
    "mse",
    "multi_information",
    "ndcg_at_k",
    "posterior_collapse",
    "recall_at_k",
    "support_f_score",
    "support_jaccard",
]
