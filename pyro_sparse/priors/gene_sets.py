"""
An informative prior of the decoder mask W from gene sets: the Spike-and-Slab
Lasso of Moran et al. (2022, Eq. 2-4) with a prior inclusion of its own for
each (gene, factor) entry, high inside the factor's gene set and low outside.
"""

import os
import warnings

import numpy as np
import torch

from pyro_sparse.checks import is_count
from pyro_sparse.distributions import SpikeSlabLasso
from pyro_sparse.priors.ssl import SpikeSlabLassoPrior


def read_gmt(path):
    """
    The gene sets of a ``.gmt`` file as ``{set name: [genes]}``, in file order.

    One set per line, tab-separated: name, description, then the genes (the
    format of MSigDB and Enrichr).  Plain text split on tabs, nothing evaluated.
    Blank lines are skipped; a line without genes, a repeated set name or an
    undecodable file is an error naming the line.
    """
    try:
        with open(path, encoding="utf-8-sig") as stream:  # "-sig": a byte-order mark is not part of a set's name
            lines = stream.read().splitlines()
    except OSError as error:
        raise ValueError(f"cannot read the gene-set file {os.fspath(path)!r}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"the gene-set file {os.fspath(path)!r} is not UTF-8 text ({error.reason} at byte "
                         f"{error.start}); a .gmt file is tab-separated text") from None
    sets = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split("\t")]
        name, genes = fields[0], [gene for gene in fields[2:] if gene]
        if not name:
            raise ValueError(f"{os.fspath(path)!r}, line {number}: the set has no name (first tab-separated field)")
        if not genes:
            raise ValueError(f"{os.fspath(path)!r}, line {number}: set {name!r} lists no genes (a .gmt line is "
                             "name<TAB>description<TAB>gene<TAB>gene...)")
        if name in sets:
            raise ValueError(f"{os.fspath(path)!r}, line {number}: set {name!r} appears twice")
        sets[name] = genes
    if not sets:
        raise ValueError(f"the gene-set file {os.fspath(path)!r} holds no gene sets")
    return sets


def _as_dict(gene_sets):
    """
    ``{set name: [genes]}``, in the sets' order, from a boolean DataFrame
    (genes x sets), a dict of gene lists, a list of ``[name, genes]`` pairs
    (the form a model file records) or a .gmt path.
    """
    if isinstance(gene_sets, (str, os.PathLike)):
        return read_gmt(gene_sets)
    if hasattr(gene_sets, "columns") and hasattr(gene_sets, "index"):  # a pandas DataFrame, genes x sets
        table = gene_sets
        not_boolean = [str(column) for column, dtype in table.dtypes.items() if dtype != bool]
        if not_boolean:
            raise TypeError(f"the gene-set table must be boolean (genes as index, one bool column per set); "
                            f"columns {not_boolean[:5]} are not (e.g. table.astype(bool))")
        if table.index.has_duplicates:
            raise ValueError(f"the gene-set table names genes more than once: "
                             f"{list(table.index[table.index.duplicated()].unique()[:5])}")
        names = table.columns.astype(str)
        if names.has_duplicates:
            raise ValueError(f"the gene-set table repeats set names (as text): "
                             f"{list(names[names.duplicated()].unique()[:5])}")
        return {name: [str(gene) for gene in table.index[table[column].to_numpy()]]
                for name, column in zip(names, table)}
    if isinstance(gene_sets, (list, tuple)) and all(isinstance(pair, (list, tuple)) and len(pair) == 2
                                                    for pair in gene_sets):
        pairs = list(gene_sets)
    elif isinstance(gene_sets, dict):
        pairs = list(gene_sets.items())
    else:
        raise TypeError(f"gene_sets must be a boolean pandas DataFrame (genes x sets), a dict set -> genes or the "
                        f"path of a .gmt file, got a {type(gene_sets).__name__}")
    for name, genes in pairs:
        if isinstance(genes, (str, bytes)) or not np.iterable(genes):
            raise TypeError(f"gene set {name!r} must be a list of gene names, got {genes!r}")
    names = [str(name) for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"gene_sets repeat the set names {repeated[:5]} (as text): rename them")
    return {name: [str(gene) for gene in genes] for name, (_, genes) in zip(names, pairs)}


def match_membership(columns, saved):
    """
    For each of ``saved``'s membership columns (lists of bools, in a saved
    model's factor order), the index of the equal one among ``columns``
    (identical sets are interchangeable: taken in turn); None where one has no
    match.  Files written before the sets were recorded in order (a JSON
    object, keys sorted) get their factors' order back this way.
    """
    order = []
    for column in saved:
        match = next((k for k, candidate in enumerate(columns) if k not in order and candidate == column), None)
        if match is None:
            return None
        order.append(match)
    return order


def align_gene_sets(gene_sets, feature_names):
    """
    The annotation as ``(set names, membership)``, membership a (G, S) bool
    array over the data's features in their order.  Genes the annotation
    names but the data lack are dropped with a warning giving their count; no
    gene in the data, or a set left without genes, is an error.
    """
    sets = _as_dict(gene_sets)
    empty = [name for name, genes in sets.items() if not genes]
    if empty:
        raise ValueError(f"gene sets {empty[:5]} hold no genes; remove them")
    if feature_names is None:
        raise ValueError("gene_sets name genes, but the data have no feature names: train on an AnnData (its "
                         "var_names) or a pandas DataFrame whose columns are the gene names")
    feature_names = [str(name) for name in feature_names]
    row = {name: j for j, name in enumerate(feature_names)}
    if len(row) < len(feature_names):
        raise ValueError("the data's feature names repeat, so genes cannot be matched to them; make them unique "
                         "(e.g. adata.var_names_make_unique())")
    named = {gene for genes in sets.values() for gene in genes}
    absent = sorted(named - row.keys())
    if len(absent) == len(named):
        raise ValueError(f"none of the {len(named)} genes of gene_sets is among the data's {len(feature_names)} "
                         f"features (e.g. {absent[:3]} vs {feature_names[:3]}): check the gene identifiers")
    if absent:
        warnings.warn(f"gene_sets name {len(absent)} of their {len(named)} genes that the data lack (e.g. "
                      f"{absent[:5]}); using the other {len(named) - len(absent)}", stacklevel=3)
    membership = np.zeros((len(feature_names), len(sets)), dtype=bool)
    for s, genes in enumerate(sets.values()):
        membership[[row[gene] for gene in genes if gene in row], s] = True
    emptied = [name for name, column in zip(sets, membership.T) if not column.any()]
    if emptied:
        raise ValueError(f"gene sets {emptied[:5]} have none of their genes in the data; remove them")
    return list(sets), membership


class GeneSetPrior(SpikeSlabLassoPrior):
    r"""
    The SSL prior of a (G, K) mask W whose first S factors are named gene
    sets and whose last F = K - S factors are free.  Eq. 2-4 with the
    factor's η_k replaced by a per-entry prior inclusion θ_jk:

    .. math::

        w_{jk} \sim \theta_{jk}\,\psi_1(w_{jk}) + (1 - \theta_{jk})\,\psi_0(w_{jk}),\qquad
        \theta_{jk} = \begin{cases} \text{inside} & j \in \text{set } k \\
        \text{outside} & j \notin \text{set } k \end{cases} \ (k \le S),
        \qquad \theta_{jk} = \eta_k \ (k > S),

    the free factors' η_k learned by Algorithm 1's Beta(a, b) update.  The
    E-step (Eq. 57) gives each entry its posterior inclusion
    E[γ_jk | w_jk] = θ_jk ψ1 / (θ_jk ψ1 + (1 - θ_jk) ψ0), and λ*_jk (Eq. 58)
    follows, so an annotated gene whose w_jk the data drive into the spike
    leaves its set, and an unannotated one they pull into the slab joins it.
    The proximal hooks and the λ0 path are those of
    :class:`~pyro_sparse.priors.SpikeSlabLassoPrior`.

    K must be S + ``num_free_factors``; ``num_free_factors=None`` takes K - S.
    Where w_jk = 0, E[γ_jk] = θ λ1 / (θ λ1 + (1 - θ) λ0), 1/6 with the
    defaults (θ = 0.8, λ0 = 20): E[γ] alone cannot call a removal at an FDR
    below that.  :meth:`changes` therefore ranks the changes by the
    posterior probability that \|w_jk\| exceeds the prior's spike/slab
    crossing, which the data can drive to 0 or 1
    (:meth:`pyro_sparse.FittedModel.support_probability`).

    :param int num_features: G.
    :param int latent_dim: K.
    :param gene_sets: genes x sets boolean pandas DataFrame, dict set -> list
        of genes, or the path of a ``.gmt`` file (:func:`read_gmt`); genes
        absent from the data are dropped with a warning (:func:`align_gene_sets`).
    :param list feature_names: the data's gene names (``train`` passes them).
    :param int num_free_factors: F, unannotated factors after the sets.
    :param float inside: θ of a gene in the factor's set.
    :param float outside: θ of a gene outside it.
    :param lambda0, lambda1, a, b, gradient_averaging, lambda0_path, lambda0_path_epochs:
        as for :class:`~pyro_sparse.priors.SpikeSlabLassoPrior`.
    """

    def __init__(self, num_features, latent_dim, gene_sets, feature_names=None, num_free_factors=None, inside=0.8,
                 outside=0.02, lambda0=20.0, lambda1=1.0, a=1.0, b=None, gradient_averaging=0.01,
                 lambda0_path=(2.0, 10.0), lambda0_path_epochs=10.0):
        super().__init__(num_features, latent_dim, lambda0, lambda1, a, b, gradient_averaging, lambda0_path,
                         lambda0_path_epochs)
        if not 0 < outside < inside < 1:
            raise ValueError(f"need 0 < outside < inside < 1, got outside={outside!r}, inside={inside!r}")
        self.inside, self.outside = float(inside), float(outside)
        if feature_names is not None and len(feature_names) != num_features:
            raise ValueError(f"got {len(feature_names)} feature names for {num_features} features")
        self.set_names, membership = align_gene_sets(gene_sets, feature_names)
        self.feature_names = [str(name) for name in feature_names]
        num_sets = len(self.set_names)
        if num_free_factors is None:
            if latent_dim < num_sets:
                raise ValueError(f"latent_dim={latent_dim} is fewer than the {num_sets} gene sets: pass latent_dim="
                                 f"{num_sets} or more (a factor per set, then free factors)")
            num_free_factors = latent_dim - num_sets
        if not is_count(num_free_factors, minimum=0):
            raise ValueError(f"num_free_factors must be a non-negative integer, got {num_free_factors!r}")
        if num_sets + num_free_factors != latent_dim:
            raise ValueError(f"latent_dim={latent_dim}, but {num_sets} gene sets + {num_free_factors} free factors "
                             f"make {num_sets + num_free_factors} factors: pass latent_dim="
                             f"{num_sets + num_free_factors} (or num_free_factors={latent_dim - num_sets})"
                             if latent_dim >= num_sets else
                             f"latent_dim={latent_dim} is fewer than the {num_sets} gene sets: pass latent_dim="
                             f"{num_sets + num_free_factors}")
        self.num_sets = num_sets
        self.register_buffer("membership", torch.as_tensor(membership))
        annotated = self._annotated_inclusion()
        # η_k of a set's factor: the share of genes its prior expects it to use (fixed).
        self.eta[:num_sets] = annotated.mean(0)
        self.inclusion_probs.copy_(self.prior_inclusion())

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """
        Files written before the sets were recorded in order hold them as a
        JSON object, whose keys were sorted: the saved membership, in the
        factors' order, puts the names back in it.
        """
        saved = state_dict.get(prefix + "membership")
        current = self.membership.cpu()  # the state is read onto the CPU, the model may be on a GPU
        if saved is not None and saved.shape == current.shape and not torch.equal(saved.cpu(), current):
            order = match_membership(current.T.tolist(), saved.cpu().T.tolist())
            if order is None:
                raise ValueError("the saved gene-set membership does not match the recorded gene sets one to "
                                 "one, so the factors' set names cannot be recovered: refit the model")
            self.set_names = [self.set_names[k] for k in order]
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    @torch.no_grad()
    def initialize(self, mask):
        """
        Start W at the annotation: a set's factor starts on its set's genes
        only (the other entries of its column at 0), so that factor k is set k
        from the first step.  From W = 1 everywhere the codes settle on
        arbitrary mixtures of the factors before the penalty separates the
        sets, and the annotation ends up on the wrong codes.  The free factors
        start on the genes that no set names (on all genes if every gene is
        in a set): starting on every gene, a free code could take a set's
        factor first, leaving that set's code to another (measured: docs,
        Results, single cell).  The data can still add any gene to any factor.
        """
        mask[:, : self.num_sets].masked_fill_(~self.membership, 0.0)
        annotated = self.membership.any(1, keepdim=True)
        if not annotated.all():
            mask[:, self.num_sets:].masked_fill_(annotated, 0.0)

    def _annotated_inclusion(self):
        """θ of the set factors, (G, S)."""
        return torch.where(self.membership, self.inside, self.outside)

    def prior_inclusion(self):
        """θ_jk, (G, K): inside / outside for the sets' factors, η_k for the free ones."""
        free = self.eta[self.num_sets:].expand(self.num_features, -1)
        return torch.cat([self._annotated_inclusion().to(free.dtype), free], dim=1)

    def _ssl(self, like):
        return SpikeSlabLasso(self.prior_inclusion().to(like.dtype), self.spike_rate.item(), self.lambda1)

    def distribution(self):
        """The prior of W as a Pyro distribution with event shape (G, K)."""
        return SpikeSlabLasso(self.prior_inclusion(), self.spike_rate.item(), self.lambda1).to_event(2)

    @torch.no_grad()
    def update(self, mask):
        """E-step (Eq. 57) with the per-entry θ, then Algorithm 1's η update for the free factors only."""
        w = mask.detach().double()
        probs = self._ssl(w).inclusion_probability(w)
        self.eta[self.num_sets:] = self._eta_update(probs[:, self.num_sets:])
        self.inclusion_probs.copy_(probs)

    def changes(self, support_probability, fdr=None):
        r"""
        Genes the posterior moves into or out of each set, as a pandas
        DataFrame with columns ``set``, ``gene``, ``change`` (``"added"`` /
        ``"removed"``), ``inclusion_probability`` (the E-step's E[γ_jk | w_jk]),
        ``support_probability`` (P(\|w_jk\| > δ_jk | data), given: a (G, K)
        array such as :meth:`pyro_sparse.FittedModel.support_probability`
        returns) and ``error_probability``, the posterior probability that
        the change is wrong (the support probability of a removal, one minus
        it for an addition).

        ``fdr=None``: every change with error probability < 0.5.  ``fdr=α``:
        the Bayesian FDR rule of Newton et al. (2004, Biostatistics 5:155,
        Sec. 3.2), applied to removals and to additions separately, each
        pooled over all sets: sort the candidates by error probability and
        report the longest prefix whose mean error probability, the posterior
        expected share of wrong calls in the list, is at most α.  (The
        running mean of sorted values never decreases, so the prefix is well
        defined.)
        """
        import pandas as pd  # only this method needs pandas

        if fdr is not None and not 0 < fdr < 1:
            raise ValueError(f"fdr must be in (0, 1), got {fdr!r}")
        support = np.asarray(support_probability, dtype=float)
        if support.shape != tuple(self.inclusion_probs.shape):
            raise ValueError(f"support_probability must have shape {tuple(self.inclusion_probs.shape)}, got "
                             f"{support.shape}")
        support = support[:, : self.num_sets]
        probs = self.inclusion_probs[:, : self.num_sets].double().cpu().numpy()
        member = self.membership.cpu().numpy()
        tables = []
        for change, candidates, error in (("removed", member, support), ("added", ~member, 1 - support)):
            genes, sets = np.nonzero(candidates)
            errors = error[genes, sets]
            order = np.argsort(errors, kind="stable")
            if fdr is None:
                keep = order[errors[order] < 0.5]
            else:
                # The longest prefix whose mean error is within fdr (the running mean of sorted errors only
                # rises, but can dip back by a rounding step at exact ties, so take the last index that passes).
                running_mean = np.cumsum(errors[order]) / np.arange(1, len(order) + 1)
                passing = np.flatnonzero(running_mean <= fdr)
                keep = order[: passing[-1] + 1 if passing.size else 0]
            tables.append(pd.DataFrame({
                "set": np.asarray(self.set_names, dtype=object)[sets[keep]],
                "gene": np.asarray(self.feature_names, dtype=object)[genes[keep]],
                "change": change,
                "inclusion_probability": probs[genes[keep], sets[keep]],
                "support_probability": support[genes[keep], sets[keep]],
                "error_probability": errors[keep],
            }))
        table = pd.concat(tables, ignore_index=True)
        order = np.lexsort((table["error_probability"].to_numpy(), table["change"].to_numpy(),
                            [self.set_names.index(name) for name in table["set"]]))
        return table.iloc[order].reset_index(drop=True)

    @classmethod
    def resolve_options(cls, hyper, feature_names):
        """
        The options as a model file records them: ``gene_sets`` read (a .gmt
        path), aligned to ``feature_names`` and written as ``[name, genes]``
        pairs of the genes present in the data, in the factors' order (a JSON
        object's keys are sorted on writing), so ``load`` rebuilds the same
        prior and a resumed run must name the sets in the same order.
        """
        if "gene_sets" not in hyper:
            raise TypeError("mask_prior='gene_sets' needs gene_sets= (a boolean DataFrame genes x sets, a dict "
                            "set -> genes or a .gmt path)")
        set_names, membership = align_gene_sets(hyper["gene_sets"], feature_names)
        names = np.asarray([str(name) for name in feature_names], dtype=object)
        return {**hyper, "gene_sets": [[name, names[column].tolist()] for name, column in zip(set_names, membership.T)]}
