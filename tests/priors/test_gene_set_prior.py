"""Tests of GeneSetPrior: the per-entry prior inclusion, its E-step, alignment of gene sets to the data,
.gmt parsing, the factor count, the report of changes and the Bayesian FDR rule."""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from pyro_sparse.distributions import SpikeSlabLasso
from pyro_sparse.priors import MASK_PRIORS, GeneSetPrior, align_gene_sets, read_gmt

GENES = ["A", "B", "C", "D", "E"]
SETS = {"s1": ["A", "B"], "s2": ["B", "C", "D"]}


def numpy_inclusion(w, theta, lambda0, lambda1):
    w = np.abs(np.asarray(w, dtype=np.float64))
    slab = theta * lambda1 / 2 * np.exp(-lambda1 * w)
    spike = (1 - theta) * lambda0 / 2 * np.exp(-lambda0 * w)
    return slab / (slab + spike)


def prior(**options):
    options = {"gene_sets": SETS, "feature_names": GENES, "lambda0_path": None, **options}
    return GeneSetPrior(5, 3, **options)


def test_registered_as_a_mask_prior():
    assert MASK_PRIORS["gene_sets"] is GeneSetPrior


def test_the_prior_inclusion_is_per_entry():
    p = prior(inside=0.9, outside=0.05)
    theta = p.prior_inclusion().numpy()
    membership = np.array([[1, 0], [1, 1], [0, 1], [0, 1], [0, 0]], dtype=bool)
    np.testing.assert_array_equal(p.membership.numpy(), membership)
    np.testing.assert_allclose(theta[:, :2], np.where(membership, 0.9, 0.05), rtol=1e-6)
    np.testing.assert_allclose(theta[:, 2], 0.5)  # the free factor's η before any E-step
    # η of a set's factor: the share of genes its prior expects it to use.
    np.testing.assert_allclose(p.eta[:2].numpy(), np.where(membership, 0.9, 0.05).mean(0), rtol=1e-6)
    w = torch.randn(5, 3)
    expected = SpikeSlabLasso(torch.as_tensor(theta), p.lambda0, p.lambda1).log_prob(w).sum()
    distribution = p.distribution()
    assert distribution.event_shape == (5, 3)
    torch.testing.assert_close(distribution.log_prob(w), expected)


def test_e_step_matches_hand_computation():
    lambda0, lambda1, a, b = 20.0, 1.0, 2.0, 3.0
    p = prior(inside=0.8, outside=0.02, lambda0=lambda0, lambda1=lambda1, a=a, b=b)
    p.eta[2] = 0.3
    mask = np.array([[0.0, 0.1, -1.2],
                     [0.05, -0.3, 0.0],
                     [2.0, 0.0, 0.02],
                     [-0.15, 0.6, 0.0],
                     [0.4, 0.0, 0.3]], dtype=np.float32)
    theta = p.prior_inclusion().double().numpy()
    eta_sets = p.eta[:2].clone()
    p.update(torch.tensor(mask))
    probs = numpy_inclusion(mask, theta, lambda0, lambda1)
    np.testing.assert_allclose(p.inclusion_probs.numpy(), probs, rtol=1e-6, atol=1e-7)
    # Algorithm 1's η update for the free factor only; the sets' η stay.
    np.testing.assert_allclose(p.eta[2].item(), (probs[:, 2].sum() + a - 1) / (a + b + 5 - 2), rtol=1e-6)
    torch.testing.assert_close(p.eta[:2], eta_sets)
    # The penalty follows Eq. 58 with the per-entry posterior.
    np.testing.assert_allclose(p.penalty_weights().numpy(), lambda1 * probs + lambda0 * (1 - probs), rtol=1e-5)


def test_a_zero_entry_inside_a_set_reads_the_prior_odds_times_the_spike_ratio():
    p = prior(inside=0.8, outside=0.02, lambda0=50.0, lambda1=1.0)
    p.update(torch.zeros(5, 3))
    # E[γ | w = 0] = θ λ1 / (θ λ1 + (1 - θ) λ0)
    assert p.inclusion_probs[0, 0].item() == pytest.approx(0.8 / (0.8 + 0.2 * 50), rel=1e-6)
    assert p.inclusion_probs[4, 0].item() == pytest.approx(0.02 / (0.02 + 0.98 * 50), rel=1e-6)


# ------------------------------------------------------------ factor count ---
def test_free_factors_default_to_the_rest_of_latent_dim():
    p = GeneSetPrior(5, 4, SETS, GENES)
    assert p.num_sets == 2 and p.eta.shape == (4,)


@pytest.mark.parametrize("latent_dim, free, message", [
    (3, 2, r"latent_dim=3, but 2 gene sets \+ 2 free factors make 4 factors: pass latent_dim=4"),
    (1, 0, r"latent_dim=1 is fewer than the 2 gene sets: pass latent_dim=2"),
    (1, None, r"latent_dim=1 is fewer than the 2 gene sets: pass latent_dim=2 or more"),
    (3, -1, r"num_free_factors must be a non-negative integer"),
])
def test_latent_dim_must_be_the_sets_plus_the_free_factors(latent_dim, free, message):
    with pytest.raises(ValueError, match=message):
        GeneSetPrior(5, latent_dim, SETS, GENES, num_free_factors=free)


@pytest.mark.parametrize("inside, outside", [(0.5, 0.6), (1.0, 0.1), (0.9, 0.0)])
def test_inclusions_must_be_ordered_probabilities(inside, outside):
    with pytest.raises(ValueError, match="0 < outside < inside < 1"):
        prior(inside=inside, outside=outside)


# ------------------------------------------------------------ alignment ---
def test_a_boolean_table_a_dict_and_a_gmt_file_give_the_same_membership(tmp_path):
    table = pd.DataFrame({"s1": [True, True, False, False], "s2": [False, True, True, True]},
                         index=["A", "B", "C", "D"])
    path = tmp_path / "sets.gmt"
    path.write_text("s1\tsome description\tA\tB\n\ns2\t\tB\tC\tD\n")
    results = [align_gene_sets(value, GENES) for value in (table, SETS, path, str(path))]
    for names, membership in results:
        assert names == ["s1", "s2"]
        np.testing.assert_array_equal(membership, results[0][1])
    assert results[0][1].shape == (5, 2)


def test_genes_absent_from_the_data_are_dropped_with_their_count():
    sets = {"s1": ["A", "B", "X1"], "s2": ["C", "X1", "X2"]}
    with pytest.warns(UserWarning, match=r"name 2 of their 5 genes that the data lack \(e.g. \['X1', 'X2'\]\); "
                                         r"using the other 3"):
        names, membership = align_gene_sets(sets, GENES)
    np.testing.assert_array_equal(membership[:, 0], [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(membership[:, 1], [0, 0, 1, 0, 0])


def test_present_genes_raise_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        align_gene_sets(SETS, GENES)


def test_no_gene_in_the_data_is_an_error():
    with pytest.raises(ValueError, match="none of the 3 genes of gene_sets is among the data's 5 features"):
        align_gene_sets({"s1": ["x", "y"], "s2": ["z"]}, GENES)


def test_a_set_left_without_genes_is_an_error():
    with pytest.warns(UserWarning, match="name 1 of"), \
            pytest.raises(ValueError, match=r"gene sets \['s2'\] have none of their genes in the data"):
        align_gene_sets({"s1": ["A"], "s2": ["X"]}, GENES)


@pytest.mark.parametrize("gene_sets, error, message", [
    ({"s1": ["A"], "s2": []}, ValueError, r"gene sets \['s2'\] hold no genes"),
    ({"s1": "ABC"}, TypeError, "gene set 's1' must be a list of gene names"),
    (pd.DataFrame({"s1": [1, 0], "s2": [True, False]}, index=["A", "B"]), TypeError,
     r"must be boolean .* columns \['s1'\] are not"),
    (pd.DataFrame({"s1": [True, False]}, index=["A", "A"]), ValueError, r"names genes more than once: \['A'\]"),
    (np.ones((5, 2), dtype=bool), TypeError, "gene_sets must be a boolean pandas DataFrame"),
])
def test_bad_annotations_say_what_is_wrong(gene_sets, error, message):
    with pytest.raises(error, match=message):
        align_gene_sets(gene_sets, GENES)


def test_gene_sets_need_feature_names():
    with pytest.raises(ValueError, match="the data have no feature names"):
        GeneSetPrior(5, 3, SETS)


def test_feature_names_must_be_unique():
    with pytest.raises(ValueError, match="feature names repeat"):
        align_gene_sets(SETS, ["A", "B", "C", "D", "A"])


# ------------------------------------------------------------ .gmt ---
def test_read_gmt_keeps_file_order_and_skips_blank_lines(tmp_path):
    path = tmp_path / "h.gmt"
    path.write_text("HALLMARK_B\thttp://x\tG1\tG2\t\n\n  \nHALLMARK_A\tna\tG3\r\n")
    assert read_gmt(path) == {"HALLMARK_B": ["G1", "G2"], "HALLMARK_A": ["G3"]}
    # A byte-order mark (Excel, Notepad) is not part of the first set's name.
    path.write_text("HALLMARK_B\tx\tG1\n", encoding="utf-8-sig")
    assert read_gmt(path) == {"HALLMARK_B": ["G1"]}


@pytest.mark.parametrize("content, message", [
    (b"s1\tdesc\n", r"line 1: set 's1' lists no genes"),
    (b"s1\tdesc\tA\ns1\tdesc\tB\n", r"line 2: set 's1' appears twice"),
    (b"\tdesc\tA\n", r"line 1: the set has no name"),
    (b"s1\tdesc\t\xff\xfe\n", r"is not UTF-8 text"),
    (b"\n\n", "holds no gene sets"),
])
def test_read_gmt_names_the_problem(tmp_path, content, message):
    path = tmp_path / "bad.gmt"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        read_gmt(path)


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read the gene-set file .*missing.gmt"):
        read_gmt(tmp_path / "missing.gmt")


# ------------------------------------------------------------ changes and FDR ---
# Rows A-E; s1 = {A, B}, s2 = {B, C, D}.  The calls follow the support
# probabilities; the E-step's E[γ] (set apart, to tell the columns apart) is reported beside them.
SUPPORT = [[0.95, 0.02],
           [0.03, 0.90],
           [0.60, 0.10],
           [0.01, 0.45],
           [0.99, 0.30]]


def with_posterior(probs):
    """The prior with E[γ] = (1 + probs) / 4 (not the support probabilities) and the support table, free column 0."""
    p = prior()
    p.inclusion_probs[:, :2] = (1 + torch.tensor(probs, dtype=torch.float32)) / 4
    support = np.zeros(tuple(p.inclusion_probs.shape))
    support[:, :2] = probs
    return p, support


def test_changes_at_one_half():
    p, support = with_posterior(SUPPORT)
    table = p.changes(support)
    assert list(table.columns) == ["set", "gene", "change", "inclusion_probability", "support_probability",
                                   "error_probability"]
    rows = [tuple(row) for row in table[["set", "gene", "change"]].itertuples(index=False)]
    assert rows == [("s1", "E", "added"), ("s1", "C", "added"), ("s1", "B", "removed"),
                    ("s2", "C", "removed"), ("s2", "D", "removed")]
    support_of_rows = np.array([0.99, 0.60, 0.03, 0.10, 0.45])
    np.testing.assert_allclose(table["support_probability"], support_of_rows, rtol=1e-6)
    np.testing.assert_allclose(table["inclusion_probability"], (1 + support_of_rows) / 4, rtol=1e-6)
    np.testing.assert_allclose(table["error_probability"], [0.01, 0.40, 0.03, 0.10, 0.45], rtol=1e-5)


def test_the_bayesian_fdr_rule_takes_the_longest_list_whose_mean_error_is_within_fdr():
    p, support = with_posterior(SUPPORT)
    # Removals sorted by support: B/s1 0.03, C/s2 0.10, D/s2 0.45, A/s1 0.95, B/s2 0.90 ...
    # running means 0.03, 0.065, 0.193, ...: α = 0.1 keeps two, α = 0.2 three.
    removed = p.changes(support, fdr=0.1).query("change == 'removed'")
    assert sorted(zip(removed["set"], removed["gene"])) == [("s1", "B"), ("s2", "C")]
    assert len(p.changes(support, fdr=0.2).query("change == 'removed'")) == 3
    # Additions sorted by 1 - support: E/s1 0.01, C/s1 0.40, E/s2 0.70 ...: running means 0.01, 0.205.
    added = p.changes(support, fdr=0.1).query("change == 'added'")
    assert list(zip(added["set"], added["gene"])) == [("s1", "E")]
    assert len(p.changes(support, fdr=0.25).query("change == 'added'")) == 2
    with pytest.raises(ValueError, match="fdr must be in"):
        p.changes(support, fdr=1.5)
    with pytest.raises(ValueError, match=r"support_probability must have shape \(5, 3\)"):
        p.changes(support[:, :2])


def test_the_fdr_rule_keeps_a_list_whose_mean_error_is_exactly_fdr():
    # Five removals of error 0.1 each: their running means round to 0.1 + 1.4e-17 at the third, yet all five
    # together have mean error 0.1, so fdr = 0.1 keeps all five.
    p = prior()
    support = np.full(tuple(p.inclusion_probs.shape), 0.1)
    removed = p.changes(support, fdr=0.1).query("change == 'removed'")
    assert len(removed) == 5


def test_resolve_options_records_the_aligned_sets_as_json(tmp_path):
    path = tmp_path / "sets.gmt"
    path.write_text("s1\t-\tA\tB\tX\ns2\t-\tD\tC\n")
    with pytest.warns(UserWarning, match="name 1 of their 5 genes"):
        hyper = GeneSetPrior.resolve_options({"gene_sets": path, "inside": 0.9}, GENES)
    # In the data's order, without the absent gene: the JSON a model file keeps.
    assert hyper == {"gene_sets": [["s1", ["A", "B"]], ["s2", ["C", "D"]]], "inside": 0.9}
    with pytest.raises(TypeError, match="needs gene_sets="):
        GeneSetPrior.resolve_options({}, GENES)
