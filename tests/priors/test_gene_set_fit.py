"""mask_prior="gene_sets" through train and load: feature names reach the prior, the aligned sets are saved
with the model, errors come before training, and the changes are reported."""

import numpy as np
import pandas as pd
import pyro
import pytest
import torch

import pyro_sparse
from pyro_sparse import Checkpointing, Schedule
from pyro_sparse.data.synthetic import synthetic_gene_set_counts
from pyro_sparse.io import serialization

QUICK = dict(hidden_dims=(8,), batch_size=100, max_epochs=2, progress=False, device="cpu",
             likelihood="negative_binomial")


@pytest.fixture(scope="module")
def data():
    return synthetic_gene_set_counts(n=200, num_genes=30, num_sets=2, set_size=6, num_unannotated=1, seed=0)


def frame(data):
    return pd.DataFrame(data.X, columns=list(data.feature_names))


def test_the_prior_gets_the_feature_names_and_starts_w_at_the_annotation(data):
    fitted = pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3,
                               **{**QUICK, "max_epochs": 1}, mask_prior="gene_sets", gene_sets=data.gene_sets())
    prior = fitted.model.site_priors["W"]
    assert prior.feature_names == list(data.feature_names) and prior.set_names == ["set0", "set1"]
    np.testing.assert_array_equal(prior.membership.numpy(), data.annotation)
    assert fitted.config["hyperparameters"]["gene_sets"] == [list(pair) for pair in data.gene_sets().items()]
    assert fitted.config["hyperparameters"]["mask_prior"] == "gene_sets"


def test_initialize_starts_sets_on_their_genes_and_free_factors_on_the_others(data):
    from pyro_sparse.priors import GeneSetPrior

    prior = GeneSetPrior(30, 3, data.gene_sets(), data.feature_names)
    mask = torch.ones(30, 3)
    prior.initialize(mask)
    np.testing.assert_array_equal(mask[:, :2].numpy(), data.annotation)
    unannotated = ~data.annotation.any(1)
    assert 0 < unannotated.sum() < 30
    np.testing.assert_array_equal(mask[:, 2].numpy(), unannotated)


def test_a_free_factor_starts_on_every_gene_when_the_sets_name_them_all():
    from pyro_sparse.priors import GeneSetPrior

    prior = GeneSetPrior(4, 3, {"a": ["g0", "g1"], "b": ["g2", "g3"]}, ["g0", "g1", "g2", "g3"])
    mask = torch.ones(4, 3)
    prior.initialize(mask)
    assert mask[:, 0].tolist() == [1, 1, 0, 0] and mask[:, 2].tolist() == [1, 1, 1, 1]


def test_a_wrong_latent_dim_fails_before_training(data):
    with pytest.raises(ValueError, match=r"latent_dim=5, but 2 gene sets \+ 1 free factors make 3 factors"):
        pyro_sparse.train("ssl_dgm", frame(data), latent_dim=5, mask_prior="gene_sets", gene_sets=data.gene_sets(),
                          num_free_factors=1, **QUICK)


def test_unnamed_data_cannot_take_gene_sets(data):
    with pytest.raises(ValueError, match="the data have no feature names"):
        pyro_sparse.train("ssl_dgm", data.X, latent_dim=3, mask_prior="gene_sets", gene_sets=data.gene_sets(),
                          **QUICK)


def test_a_gmt_file_with_unknown_genes_trains_saves_and_loads_without_the_file(data, tmp_path):
    gmt = tmp_path / "sets.gmt"
    lines = [f"{name}\tdescription\t" + "\t".join([*genes, "NOT_A_GENE"]) for name, genes in data.gene_sets().items()]
    gmt.write_text("\n".join(lines) + "\n")
    with pytest.warns(UserWarning, match=r"name 1 of their \d+ genes that the data lack"):
        fitted = pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets", gene_sets=gmt,
                                   inside=0.9, outside=0.05, **QUICK)
    path = tmp_path / "model.pt"
    fitted.save(path)
    gmt.unlink()
    loaded = pyro_sparse.load(path, device="cpu")
    before, after = fitted.model.site_priors["W"], loaded.model.site_priors["W"]
    assert type(after).__name__ == "GeneSetPrior" and (after.inside, after.outside) == (0.9, 0.05)
    assert after.set_names == before.set_names and after.feature_names == before.feature_names
    for name in ("membership", "eta", "inclusion_probs", "spike_rate"):
        torch.testing.assert_close(getattr(after, name), getattr(before, name))
    pyro.set_rng_seed(0)
    changes = fitted.gene_set_changes(frame(data))
    pyro.set_rng_seed(0)
    pd.testing.assert_frame_equal(loaded.gene_set_changes(frame(data)), changes)
    np.testing.assert_allclose(loaded.transform(frame(data)), fitted.transform(frame(data)), rtol=1e-5, atol=1e-6)


def reversed_sets(data):
    """The sets under names whose sorted order is not the factors' order."""
    return dict(zip(["zeta", "alpha"], data.gene_sets().values()))


def test_set_names_keep_the_factors_order_through_save_load_and_old_files(data, tmp_path):
    fitted = pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets",
                               gene_sets=reversed_sets(data), **{**QUICK, "max_epochs": 1})
    assert fitted.model.site_priors["W"].set_names == ["zeta", "alpha"]
    fitted.save(tmp_path / "model.pt")
    assert pyro_sparse.load(tmp_path / "model.pt").model.site_priors["W"].set_names == ["zeta", "alpha"]
    # A file from before the sets were recorded in order: a JSON object, its keys sorted on writing.
    config, states = serialization.read(tmp_path / "model.pt")
    config["hyperparameters"]["gene_sets"] = dict(config["hyperparameters"]["gene_sets"])
    serialization.write(tmp_path / "old.pt", config, states)
    old = pyro_sparse.load(tmp_path / "old.pt")
    assert old.model.site_priors["W"].set_names == ["zeta", "alpha"]
    pyro.set_rng_seed(0)
    changes = fitted.gene_set_changes(frame(data))
    pyro.set_rng_seed(0)
    pd.testing.assert_frame_equal(old.gene_set_changes(frame(data)), changes)
    # Two sets with the same genes are interchangeable: taken in turn.
    same = {"zeta": data.gene_sets()["set0"], "beta": data.gene_sets()["set1"], "alpha": data.gene_sets()["set1"]}
    twins = pyro_sparse.train("ssl_dgm", frame(data), latent_dim=4, mask_prior="gene_sets", gene_sets=same,
                              **{**QUICK, "max_epochs": 1})
    twins.save(tmp_path / "twins.pt")
    twin_config, twin_states = serialization.read(tmp_path / "twins.pt")
    twin_config["hyperparameters"]["gene_sets"] = dict(twin_config["hyperparameters"]["gene_sets"])
    serialization.write(tmp_path / "old_twins.pt", twin_config, twin_states)
    assert pyro_sparse.load(tmp_path / "old_twins.pt").model.site_priors["W"].set_names[0] == "zeta"
    # Sets whose genes match no saved factor cannot be put back in order.
    config["hyperparameters"]["gene_sets"] = {"alpha": data.gene_sets()["set0"], "zeta": data.gene_sets()["set0"]}
    serialization.write(tmp_path / "bad.pt", config, states)
    with pytest.raises(Exception, match="refit the model"):
        pyro_sparse.load(tmp_path / "bad.pt")


def test_a_checkpoint_that_recorded_the_sets_as_an_object_resumes(data, tmp_path):
    # Written before the sets were recorded in order: a JSON object, keys sorted.
    path = tmp_path / "run.pt"
    pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets", gene_sets=reversed_sets(data),
                      checkpointing=Checkpointing(path=path), schedule=Schedule(kl_warmup_epochs=1),
                      **{**QUICK, "max_epochs": 1})
    from pyro_sparse.infer import checkpoints

    config, states = serialization.read(path, checkpoints.CHECKPOINT_FILE)
    config["run"]["hyperparameters"]["gene_sets"] = dict(config["run"]["hyperparameters"]["gene_sets"])
    serialization.write(path, config, states, checkpoints.CHECKPOINT_FILE)
    resumed = pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets",
                                gene_sets=reversed_sets(data), checkpointing=Checkpointing(resume_from=path),
                                schedule=Schedule(kl_warmup_epochs=1), **QUICK)
    assert resumed.model.site_priors["W"].set_names == ["zeta", "alpha"]
    assert [name for name, _ in resumed.config["hyperparameters"]["gene_sets"]] == ["zeta", "alpha"]
    assert len(resumed.history_["train_loss"]) == QUICK["max_epochs"]
    # The object lost the order; the saved membership keeps it, and a run passing another order is refused.
    swapped = dict(reversed(list(reversed_sets(data).items())))
    with pytest.raises(Exception,
                       match=r"factor order \['zeta', 'alpha'\]; this run passes them as \['alpha', 'zeta'\]"):
        pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets", gene_sets=swapped,
                          checkpointing=Checkpointing(resume_from=path), schedule=Schedule(kl_warmup_epochs=1),
                          **QUICK)


def test_a_resumed_run_must_name_the_sets_in_the_same_order(data, tmp_path):
    checkpoint = Checkpointing(path=tmp_path / "run.pt")
    pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets", gene_sets=reversed_sets(data),
                      checkpointing=checkpoint, **{**QUICK, "max_epochs": 1})
    swapped = dict(reversed(list(reversed_sets(data).items())))
    with pytest.raises(ValueError, match="gene_sets"):
        pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets", gene_sets=swapped,
                          checkpointing=Checkpointing(path=tmp_path / "run.pt", resume_from=tmp_path / "run.pt"),
                          **QUICK)


def test_set_names_that_collide_as_text_are_refused(data):
    sets = data.gene_sets()
    with pytest.raises(ValueError, match=r"repeat the set names \['1'\]"):
        pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets",
                          gene_sets={1: sets["set0"], "1": sets["set1"]}, **QUICK)
    table = pd.DataFrame({1: [True, False], "1": [False, True]}, index=sets["set0"][:2])
    with pytest.raises(ValueError, match=r"repeats set names \(as text\): \['1'\]"):
        pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, mask_prior="gene_sets", gene_sets=table, **QUICK)


def test_gene_set_changes_needs_the_gene_set_prior(data):
    fitted = pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, **QUICK)
    with pytest.raises(AttributeError, match="not trained with mask_prior='gene_sets'"):
        fitted.gene_set_changes(frame(data))


def test_gene_set_options_are_offered_and_misplaced_ones_named(data):
    with pytest.raises(TypeError, match=r"'num_free_factors' belongs to mask_prior='gene_sets'"):
        pyro_sparse.train("ssl_dgm", frame(data), latent_dim=3, num_free_factors=1, **QUICK)
