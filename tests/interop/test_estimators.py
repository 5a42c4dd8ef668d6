"""scikit-learn estimators (pyro_sparse.interop.sklearn): the same fits as ``train``,
scikit-learn's conventions, and use inside pipelines and model selection."""

import inspect
import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import (
    check_dont_overwrite_parameters,
    check_estimators_pickle,
    check_fit_idempotent,
    check_get_params_invariance,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
    parametrize_with_checks,
)

import pyro_sparse
from pyro_sparse import Schedule, registry
from pyro_sparse.data.synthetic import synthetic_sparse_dgm
from pyro_sparse.guides import GUIDES
from pyro_sparse.interop.sklearn import (
    OIVAE,
    VAE,
    VSC,
    SparseVAE,
    SVIEstimator,
    ThresholdedVSC,
)
from pyro_sparse.priors import LATENT_PRIORS, MASK_PRIORS

ESTIMATORS = [SparseVAE, VAE, VSC, ThresholdedVSC, OIVAE]
QUICK = {"latent_dim": 2, "hidden_dims": (8,), "max_epochs": 2, "batch_size": 50, "device": "cpu"}
TRAINING = ("likelihood", "max_epochs", "batch_size", "lr", "device")


def quick(cls, **parameters):
    return cls(**{**QUICK, "random_state": 0, **parameters})


@pytest.fixture(scope="module")
def data():
    return synthetic_sparse_dgm(n=100, rho=0.0, seed=0)


# ---------------------------------------------------------- the parameters ---
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_parameters_are_trains_with_its_defaults(cls):
    """Every parameter reaches train() under its own name, defaulting to what train() would use."""
    name = cls._model_name
    entry = registry.MODELS[name]
    train_defaults = {k: p.default for k, p in inspect.signature(pyro_sparse.train).parameters.items()}
    latent_prior = LATENT_PRIORS[entry.latent_prior]
    classes = [GUIDES[latent_prior.guide_family], latent_prior, entry.model]
    if entry.mask_prior is not None:
        classes.insert(2, MASK_PRIORS[entry.mask_prior])
    model_defaults = {
        **{k: p.default for cls_ in classes for k, p in inspect.signature(cls_.__init__).parameters.items()},
        "latent_prior": entry.latent_prior,
        "mask_prior": entry.mask_prior,
    }
    parameters = inspect.signature(cls.__init__).parameters
    hyperparameters = entry.option_names()
    for key, parameter in parameters.items():
        if key in ("self", "random_state", "n_init", "model_options"):
            continue
        if key in ("latent_dim",) + TRAINING:
            assert parameter.default == train_defaults[key], key
        elif key == "progress":
            assert parameter.default is False
        elif key == "hidden_dims" and entry.count_networks:
            assert parameter.default is None  # train's widths, which depend on the likelihood
        else:
            assert key in hyperparameters, key
            assert parameter.default == model_defaults[key], key
    assert parameters["random_state"].default is None and parameters["model_options"].default is None


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_get_params_set_params_round_trip(cls):
    estimator = cls(latent_dim=3)
    parameters = estimator.get_params()
    assert parameters["latent_dim"] == 3 and parameters["model_options"] is None
    assert estimator.set_params(latent_dim=4, model_options={"schedule": Schedule(kl_warmup_epochs=0)}) is estimator
    assert estimator.latent_dim == 4 and estimator.model_options == {"schedule": Schedule(kl_warmup_epochs=0)}
    estimator.set_params(**parameters)
    assert estimator.get_params() == parameters
    with pytest.raises(ValueError, match="Invalid parameter"):
        estimator.set_params(lambda_0=1.0)


def test_clone_is_unfitted_with_equal_parameters(data):
    estimator = quick(SparseVAE, lambda0=5.0, model_options={"noise_nu": 5.0}).fit(data.X)
    copy = clone(estimator)
    assert copy.get_params() == estimator.get_params()
    assert copy.model_options is not estimator.model_options  # parameters are deep-copied
    assert "fitted_" not in vars(copy)
    with pytest.raises(NotFittedError):
        copy.transform(data.X)
    assert estimator.transform(data.X).shape == (100, 2)  # the original stays fitted


# ------------------------------------------------------------ fit and use ---
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_fit_transform_shapes(cls, data):
    estimator = quick(cls)
    codes = estimator.fit_transform(data.X)
    n, g = data.X.shape
    assert codes.shape == (n, 2) and np.isfinite(codes).all()
    assert estimator.n_features_in_ == g
    assert estimator.reconstruct(data.X).shape == (n, g)
    assert len(estimator.history_["train_loss"]) == 2
    assert np.isfinite(estimator.score(data.X))
    prefix = cls.__name__.lower()
    assert list(estimator.get_feature_names_out()) == [f"{prefix}0", f"{prefix}1"]


def test_estimator_fits_what_train_fits(data):
    """Same data, parameters and seed: the estimator and train() give the same model."""
    options = {"schedule": Schedule(kl_warmup_epochs=1), "noise_nu": 5.0}
    estimator = quick(SparseVAE, random_state=3, lambda0=5.0, model_options=options).fit(data.X)
    fitted = pyro_sparse.train("ssl_dgm", data.X, seed=3, lambda0=5.0, progress=False, **QUICK, **options)
    np.testing.assert_array_equal(estimator.transform(data.X), fitted.transform(data.X))
    np.testing.assert_array_equal(estimator.W_, fitted.W_)


def test_learned_attributes_mirror_the_fitted_model(data):
    estimator = quick(SparseVAE).fit(data.X)
    np.testing.assert_array_equal(estimator.W_, estimator.fitted_.W_)
    np.testing.assert_array_equal(estimator.inclusion_probs_, estimator.fitted_.inclusion_probs_)
    np.testing.assert_array_equal(estimator.eta_, estimator.fitted_.eta_)
    assert estimator.W_.shape == (7, 2) and estimator.eta_.shape == (2,)
    groups = quick(OIVAE, group_input_dim=3).fit(data.X)
    assert groups.W_.shape == (7, 2, 3)
    assert not hasattr(quick(VAE).fit(data.X), "W_")  # no decoder mask, no attribute


@pytest.mark.parametrize("attribute", ["W_", "inclusion_probs_", "eta_", "history_"])
def test_learned_attributes_raise_not_fitted(attribute):
    with pytest.raises(NotFittedError):
        getattr(SparseVAE(), attribute)
    assert not hasattr(SparseVAE(), attribute)  # NotFittedError is an AttributeError


@pytest.mark.parametrize("method", ["transform", "reconstruct", "score"])
def test_methods_raise_not_fitted(method, data):
    with pytest.raises(NotFittedError):
        getattr(VAE(), method)(data.X)


def test_same_random_state_same_fit(data):
    first = quick(VAE, random_state=7).fit(data.X)
    again = quick(VAE, random_state=7).fit(data.X)
    other = quick(VAE, random_state=8).fit(data.X)
    np.testing.assert_array_equal(first.transform(data.X), again.transform(data.X))
    assert not np.allclose(first.transform(data.X), other.transform(data.X))
    # Scoring draws are seeded: repeatable, and identical for identical fits.
    assert first.score(data.X) == first.score(data.X) == again.score(data.X)


def test_n_init_keeps_the_lower_loss_fit_and_reports_stability(data):
    estimator = quick(VAE, random_state=3, n_init=2).fit(data.X)
    fits = [pyro_sparse.train("vae", data.X, seed=seed, hidden_dims=(8,), latent_dim=2, max_epochs=2, batch_size=50,
                              progress=False, device="cpu") for seed in (3, 4)]
    kept = min(fits, key=lambda fitted: fitted.history_["train_loss"][-1])
    np.testing.assert_array_equal(estimator.transform(data.X), kept.transform(data.X))
    np.testing.assert_array_equal(estimator.init_losses_, [fitted.history_["train_loss"][-1] for fitted in fits])
    assert 0 <= estimator.factor_stability_.code_correlation <= 1
    # A refit resets what the fit before learned (scikit-learn's rule).
    estimator.set_params(n_init=1).fit(data.X)
    assert not hasattr(estimator, "factor_stability_") and not hasattr(estimator, "init_losses_")


def test_n_init_ranks_fits_with_a_validation_split_on_all_of_X(data):
    # Each seed draws its own split: the training losses are on different rows, so the fits are ranked on all of X.
    schedule = Schedule(validation_fraction=0.3, early_stopping=1)
    estimator = quick(VAE, random_state=5, n_init=2, model_options={"schedule": schedule}).fit(data.X)
    fits = [pyro_sparse.train("vae", data.X, seed=seed, hidden_dims=(8,), latent_dim=2, max_epochs=2, batch_size=50,
                              progress=False, device="cpu", schedule=schedule) for seed in (5, 6)]
    losses = []
    for fitted in fits:
        torch.manual_seed(0)
        losses.append(-fitted.heldout_log_likelihood(data.X, num_samples=1).mean())
    kept = fits[int(np.argmin(losses))]
    np.testing.assert_array_equal(estimator.transform(data.X), kept.transform(data.X))
    np.testing.assert_allclose(estimator.init_losses_, losses, rtol=1e-6)


def test_random_state_none_or_generator(data):
    unseeded = [quick(VAE, random_state=None).fit(data.X).transform(data.X) for _ in range(2)]
    assert not np.allclose(*unseeded)
    seeded = [
        quick(VAE, random_state=np.random.RandomState(1)).fit(data.X).transform(data.X) for _ in range(2)
    ]
    np.testing.assert_array_equal(*seeded)


def test_model_options_are_forwarded_and_may_not_repeat_parameters(data):
    options = {"mask_prior": "horseshoe", "schedule": Schedule(kl_warmup_epochs=1)}
    estimator = quick(SparseVAE, model_options=options).fit(data.X)
    assert estimator.fitted_.config["hyperparameters"]["mask_prior"] == "horseshoe"
    assert estimator.fitted_.config["training"]["kl_warmup_epochs"] == 1
    for options in ({"lambda0": 1.0}, {"seed": 1}, {"data": data.X}):
        with pytest.raises(ValueError, match="model_options sets"):
            quick(SparseVAE, model_options=options).fit(data.X)
    with pytest.raises(TypeError, match=r"no option\(s\) \['lambda_0'\]"):
        quick(SparseVAE, model_options={"lambda_0": 1.0}).fit(data.X)
    # A training setting goes in its config object, also within model_options.
    with pytest.raises(TypeError, match="Schedule"):
        quick(SparseVAE, model_options={"kl_warmup_epochs": 1}).fit(data.X)


def test_bad_input_names_the_problem(data):
    with pytest.raises(ValueError, match="NaN"):
        quick(VAE).fit(np.full((10, 3), np.nan))
    estimator = quick(VAE).fit(data.X)
    with pytest.raises(ValueError, match="X has 3 features, but VAE is expecting 7 features"):
        estimator.transform(data.X[:, :3])
    with pytest.raises(ValueError, match="non-integer values"):
        quick(VAE, likelihood="multinomial").fit(np.abs(data.X))
    anndata = pytest.importorskip("anndata")
    with pytest.raises(TypeError, match="not an AnnData; pass adata.X"):
        quick(VAE).fit(anndata.AnnData(X=data.X.astype(np.float32)))
    with pytest.raises(TypeError, match="not an AnnData"):
        estimator.transform(anndata.AnnData(X=data.X.astype(np.float32)))


def test_a_failed_refit_leaves_no_fit_behind(data):
    estimator = quick(VAE, n_init=2).fit(data.X)
    with pytest.raises(ValueError, match="NaN"):
        estimator.fit(np.full((10, 3), np.nan))
    # The fit of 7 features must not answer for the 3-feature data of the failed refit.
    assert not hasattr(estimator, "fitted_") and not hasattr(estimator, "factor_stability_")
    with pytest.raises(NotFittedError):
        estimator.transform(data.X)


def test_a_fit_whose_stability_fails_is_not_fitted(data, monkeypatch):
    from pyro_sparse.interop import sklearn as interop

    def refuse(fits, X):
        raise ValueError("codes are not finite")

    monkeypatch.setattr(interop, "factor_stability", refuse)
    estimator = quick(VAE, n_init=2)
    with pytest.raises(ValueError, match="not finite"):
        estimator.fit(data.X)
    assert not hasattr(estimator, "fitted_")


def test_n_init_with_a_checkpoint_file_is_refused(data, tmp_path):
    from pyro_sparse import Checkpointing

    for policy in (Checkpointing(path=tmp_path / "run.ckpt"), Checkpointing(resume_from=tmp_path / "run.ckpt")):
        with pytest.raises(ValueError, match="n_init=2 fits would write \\(or resume\\) one checkpoint file"):
            quick(VAE, n_init=2, model_options={"checkpointing": policy}).fit(data.X)
    assert not (tmp_path / "run.ckpt").exists()


def test_seeds_beyond_the_range_are_refused_before_training(data):
    with pytest.raises(ValueError, match=r"needs seeds up to 4294967296"):
        quick(VAE, random_state=2**32 - 1, n_init=2).fit(data.X)
    with pytest.raises(ValueError, match=r"model_options sets \['n_init'\]"):
        quick(VAE, model_options={"n_init": 2}).fit(data.X)


@pytest.mark.parametrize("sparse", [False, True])
def test_a_dataframes_column_names_reach_the_model(data, sparse):
    # They were dropped before train: mask_prior="gene_sets" could not find its genes through an estimator.
    import pandas as pd
    import scipy.sparse

    names = [f"gene{j}" for j in range(data.X.shape[1])]
    frame = pd.DataFrame(np.abs(data.X), columns=names)
    if sparse:
        frame = pd.DataFrame.sparse.from_spmatrix(scipy.sparse.csr_matrix(frame.to_numpy()), columns=names)
    gene_sets = {"first": names[:3], "second": names[3:]}
    estimator = quick(SparseVAE, model_options={"mask_prior": "gene_sets", "gene_sets": gene_sets}).fit(frame)
    assert estimator.fitted_.config["feature_names"] == names
    assert list(estimator.feature_names_in_) == names


def test_save_and_pickle_keep_the_model(data, tmp_path):
    estimator = quick(SparseVAE).fit(data.X)
    estimator.save(tmp_path / "model.pt")
    codes = estimator.transform(data.X)
    np.testing.assert_array_equal(pyro_sparse.load(tmp_path / "model.pt").transform(data.X), codes)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(estimator)).transform(data.X), codes)


# ------------------------------------------- pipelines and model selection ---
def test_pipeline_codes_feed_a_classifier(data):
    """The codes of a VAE trained on the raw data predict the sign of a true factor."""
    labels = data.z[:, 1] > 0
    pipeline = make_pipeline(quick(VAE, latent_dim=3, max_epochs=40, batch_size=25), LogisticRegression())
    pipeline.fit(data.X, labels)
    assert pipeline.score(data.X, labels) > 0.8
    assert pipeline.predict(data.X[:5]).shape == (5,)


def test_cross_val_score_gives_a_log_likelihood_per_fold(data):
    scores = cross_val_score(quick(VAE), data.X, cv=KFold(2, shuffle=True, random_state=0))
    assert scores.shape == (2,) and np.isfinite(scores).all()


def test_grid_search_picks_the_better_likelihood(data):
    """score is a log-likelihood (higher is better): 20 epochs beat 1 (by 1-1.7 nats, fold sd <= 0.4)."""
    search = GridSearchCV(quick(VAE, batch_size=25), {"max_epochs": [1, 20]}, cv=2)
    search.fit(data.X)
    assert search.best_params_ == {"max_epochs": 20}
    means = search.cv_results_["mean_test_score"]
    assert means[1] > means[0]
    assert search.best_estimator_.transform(data.X).shape == (100, 2)


# ------------------------------------------------ scikit-learn's own checks ---
# Every check of check_estimator passes for the sparse VAE (none is skipped or
# expected to fail); the other classes differ from it only in their
# parameters, so they get the parameter checks and the checks of a fit.
@parametrize_with_checks([SparseVAE(**QUICK)])
def test_sklearn_check_estimator(estimator, check):
    check(estimator)


@pytest.mark.parametrize("cls", [VAE, VSC, ThresholdedVSC, OIVAE])
@pytest.mark.parametrize(
    "check",
    [
        check_parameters_default_constructible,
        check_get_params_invariance,
        check_set_params,
        check_no_attributes_set_in_init,
        check_dont_overwrite_parameters,
        check_fit_idempotent,
        check_estimators_pickle,
    ],
)
def test_sklearn_checks(cls, check):
    check(cls.__name__, cls(**QUICK))


def test_exported_from_the_package():
    for cls in ESTIMATORS:
        assert getattr(pyro_sparse, cls.__name__) is cls
        assert issubclass(cls, SVIEstimator)


# ------------------------------------------------------ choosing K by stability ---
def _stub_fits(monkeypatch, stabilities):
    """choose_latent_dim's fits replaced by stubs with the given code stability per K (no training)."""
    from types import SimpleNamespace

    from pyro_sparse.evaluation import FactorStability
    from pyro_sparse.interop import sklearn as module

    def fitted_clone(estimator, latent_dim, X):
        return SimpleNamespace(
            latent_dim=latent_dim, factor_stability_=FactorStability(stabilities[latent_dim], 0.5, []),
            active_factors_=np.arange(latent_dim - 1), init_losses_=np.array([12.0, 10.0 - latent_dim]),
        )

    monkeypatch.setattr(module, "_fitted_clone", fitted_clone)


@pytest.mark.parametrize("stabilities, chosen", [
    ({3: 0.97, 4: 0.93, 5: 0.80, 6: 0.91}, 6),  # the largest K at or above min_stability, not the most stable
    ({3: 0.97, 4: 0.93, 5: 0.80, 6: 0.85}, 4),
    ({3: 0.70, 4: 0.85, 5: 0.85, 6: 0.60}, 5),  # none stable: the most stable, ties to the larger K
])
def test_choose_latent_dim_keeps_the_largest_stable_k(monkeypatch, stabilities, chosen):
    _stub_fits(monkeypatch, stabilities)
    choice = pyro_sparse.choose_latent_dim(SparseVAE(n_init=2), np.zeros((4, 3)), [3, 4, 5, 6])
    assert choice.latent_dim == chosen
    assert choice.estimator is choice.estimators[chosen] and choice.estimator.latent_dim == chosen
    assert [row["latent_dim"] for row in choice.table] == [3, 4, 5, 6]
    assert [row["code_stability"] for row in choice.table] == [stabilities[k] for k in (3, 4, 5, 6)]
    assert [row["active_factors"] for row in choice.table] == [2, 3, 4, 5]
    assert [row["loss"] for row in choice.table] == [7.0, 6.0, 5.0, 4.0]


def test_choose_latent_dim_fits_each_candidate_as_the_estimator_would(data):
    estimator = quick(SparseVAE, n_init=2, random_state=5)
    choice = pyro_sparse.choose_latent_dim(estimator, data.X, [3, 2])
    assert sorted(choice.estimators) == [2, 3] and not hasattr(estimator, "fitted_")  # the estimator is cloned
    for row in choice.table:
        fitted = choice.estimators[row["latent_dim"]]
        direct = quick(SparseVAE, n_init=2, random_state=5, latent_dim=row["latent_dim"]).fit(data.X)
        np.testing.assert_array_equal(fitted.transform(data.X), direct.transform(data.X))
        assert row["code_stability"] == direct.factor_stability_.code_correlation
        assert row["active_factors"] == len(direct.active_factors_)
        assert row["loss"] == direct.init_losses_.min()


@pytest.mark.parametrize("estimator, candidates, options, message", [
    (SparseVAE(n_init=1), [2, 3], {}, "n_init >= 2"),
    (SparseVAE(n_init=2), [], {}, "positive integers"),
    (SparseVAE(n_init=2), [2, 0], {}, "positive integers"),
    (SparseVAE(n_init=2), [2, 2.5], {}, "positive integers"),
    (SparseVAE(n_init=2), [3, 3], {}, "repeat"),
    (SparseVAE(n_init=2), [2, 3], {"min_stability": 0.0}, "min_stability"),
    (SparseVAE(n_init=2), [2, 3], {"min_stability": float("nan")}, "min_stability"),
    (SparseVAE(n_init=2), [2, 3], {"min_stability": "a"}, r"min_stability is a matched \|corr\| in \(0, 1\], got 'a'"),
    (GridSearchCV(SparseVAE(), {}), [2, 3], {}, "pyro_sparse's estimators"),
])
def test_choose_latent_dim_rejects_bad_options(estimator, candidates, options, message):
    with pytest.raises((ValueError, TypeError), match=message):
        pyro_sparse.choose_latent_dim(estimator, np.zeros((4, 3)), candidates, **options)
