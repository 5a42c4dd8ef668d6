"""
How well codes predict known labels (cell types, digits): the linear-probe
accuracy that the single-cell and sparse-coding papers report from a model's
latent means.
"""

import numpy as np


def linear_probe_accuracy(codes, labels, folds=5, seed=0):
    """
    Cross-validated accuracy of a multinomial logistic regression on
    standardised ``codes`` (N, K) predicting ``labels`` (N,).

    The folds are stratified and *shuffled* (``seed``): data files are often
    ordered by sample, donor or cell type, and contiguous folds then score a
    classifier on cells unlike those it was fitted on, which measures the
    ordering rather than the codes.  A label rarer than ``folds`` is missing
    from some folds (scikit-learn warns).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    codes, labels = np.asarray(codes, dtype=float), np.asarray(labels)
    if codes.ndim != 2 or labels.ndim != 1 or len(codes) != len(labels):
        raise ValueError(f"codes must be (N, K) and labels (N,), got {codes.shape} and {labels.shape}")
    if not np.isfinite(codes).all():
        raise ValueError("codes contain NaN or inf")
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or not 2 <= folds <= len(labels):
        raise ValueError(f"folds must be an integer between 2 and the number of points ({len(labels)}), got {folds!r}")
    if len(np.unique(labels)) < 2:
        raise ValueError("linear_probe_accuracy needs at least 2 distinct labels")
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000))
    splitter = StratifiedKFold(folds, shuffle=True, random_state=seed)
    return float(np.mean(cross_val_score(classifier, codes, labels, cv=splitter, error_score="raise")))
