"""The recognition network of variational sparse coding: q_φ(z | x) spike-and-slab."""

import torch
import torch.nn.functional as F

from pyro_sparse.distributions import SpikeAndSlab
from pyro_sparse.guides.amortized import AmortizedGuide


class SpikeSlabGuide(AmortizedGuide):
    r"""
    q_φ(z_ij | x_i) = γ_ij N(μ_ij, σ²_ij) + (1 - γ_ij) δ_0 (Tonolini et al.),
    the encoder giving μ, log σ² and log γ = -ReLU(-v) (supplement A.2; this
    keeps γ ≤ 1).  Draws use the spike estimator ``spike_estimator`` of
    :meth:`~pyro_sparse.distributions.SpikeAndSlab.rsample`: ``"relaxed"``,
    the relaxed reparameterisation of supplement B.1 with slope c, or
    ``"straight_through"``, exact spike-and-slab draws with Gumbel-softmax
    straight-through gradients at temperature τ (the spike-and-slab baseline
    of Fallah & Rozell 2022, Sec. 4.1).  Three schedules run through
    :meth:`schedule`:

    * ``"relaxed"``: the slope c rises linearly from ``slope_start`` to
      ``slope_end`` over ``slope_warmup_epochs`` (supplement B.2: 50 → 200);
    * ``"straight_through"``: τ starts at ``temperature_start`` and is
      multiplied by ``temperature_decay`` every iteration down to
      ``temperature_end`` (Fallah & Rozell, Appendix D: 1 → 0.5 by 0.9995);
    * spike pre-training (UAI version, Sec. 3.4 and supplement D.1): for the
      first ``pretrain_epochs`` the slab is held at the prior — the slab
      parameters enter as λμ and λ log σ² with λ = 0, so only the spike
      probabilities learn — then λ rises linearly to 1 over
      ``pretrain_ramp_epochs``.

    The slab's log σ² is clamped to [-20, ``max_log_variance``]; the default
    2 lets the slab be at most e times wider than its N(0, 1) prior.  Without
    that bound the exp of a linear output let one unusual input reach
    σ ≈ 10⁴, whose draws wrecked the decoder and the loss (docs: VSC results,
    training spikes).
    """

    # Model files written before the bound existed clamped log σ² at 20.
    former_defaults = {**AmortizedGuide.former_defaults, "max_log_variance": 20.0}
    # Each spike estimator has its own schedule (train refuses the other's options).
    option_conditions = {
        **{name: ("spike_estimator", ("relaxed",)) for name in ("slope_start", "slope_end", "slope_warmup_epochs")},
        **{name: ("spike_estimator", ("straight_through",))
           for name in ("temperature_start", "temperature_end", "temperature_decay")},
    }

    def __init__(
        self,
        num_features,
        latent_dim,
        hidden_dims=(400,),
        point_estimates=None,
        log1p_input=False,
        kl_weight=1.0,
        slope_start=50.0,
        slope_end=200.0,
        slope_warmup_epochs=100.0,
        pretrain_epochs=0.0,
        pretrain_ramp_epochs=0.0,
        spike_estimator="relaxed",
        temperature_start=1.0,
        temperature_end=0.5,
        temperature_decay=0.9995,
        network="mlp",
        covariate_dim=0,
        max_log_variance=2.0,
        batch_norm=False,
        latent_library=False,
    ):
        super().__init__(num_features, latent_dim, 3, hidden_dims, point_estimates, log1p_input, kl_weight, network,
                         covariate_dim=covariate_dim, batch_norm=batch_norm, latent_library=latent_library)
        if spike_estimator not in ("relaxed", "straight_through"):
            raise ValueError(f"spike_estimator must be 'relaxed' or 'straight_through', got {spike_estimator!r}")
        if not 0 < slope_start <= slope_end:
            raise ValueError(f"need 0 < slope_start <= slope_end, got {slope_start}, {slope_end}")
        if not 0 < temperature_end <= temperature_start:
            raise ValueError(
                f"need 0 < temperature_end <= temperature_start, got {temperature_end}, {temperature_start}"
            )
        if not 0 < temperature_decay <= 1:
            raise ValueError(f"temperature_decay must be in (0, 1], got {temperature_decay}")
        if not -20.0 < max_log_variance <= 20.0:
            raise ValueError(f"max_log_variance must be in (-20, 20], got {max_log_variance}")
        if min(slope_warmup_epochs, pretrain_epochs, pretrain_ramp_epochs) < 0:
            raise ValueError("schedule lengths must be >= 0")
        self.slope_start, self.slope_end = float(slope_start), float(slope_end)
        self.slope_warmup_epochs = float(slope_warmup_epochs)
        self.pretrain_epochs, self.pretrain_ramp_epochs = float(pretrain_epochs), float(pretrain_ramp_epochs)
        self.spike_estimator = spike_estimator
        self.temperature_start, self.temperature_end = float(temperature_start), float(temperature_end)
        self.temperature_decay = float(temperature_decay)
        self.max_log_variance = float(max_log_variance)
        # The schedules' current values are buffers: a fitted or loaded guide
        # evaluates with the values its training ended on (finished ones for a
        # fresh guide used on its own).
        self.register_buffer("slope", torch.tensor(self.slope_end))
        self.register_buffer("slab_weight", torch.tensor(1.0))
        self.register_buffer("temperature", torch.tensor(self.temperature_end))

    @staticmethod
    def _ramp(epoch, start, length):
        if length == 0:
            return float(epoch >= start)
        return min(1.0, max(0.0, (epoch - start) / length))

    def schedule(self, epoch, iteration):
        progress = self._ramp(epoch, 0.0, self.slope_warmup_epochs)
        self.slope.fill_(self.slope_start + progress * (self.slope_end - self.slope_start))
        self.temperature.fill_(max(self.temperature_end, self.temperature_start * self.temperature_decay**iteration))
        self.slab_weight.fill_(self._ramp(epoch, self.pretrain_epochs, self.pretrain_ramp_epochs))

    def posterior(self, x, covariates=None):
        loc, log_variance, v = self.encoder_outputs(x, covariates)
        # Bounded above (see the class docstring); below as the other networks'
        # log-scales, so that σ², whose log the KL takes, never underflows.
        log_variance = log_variance.clamp(-20.0, self.max_log_variance)
        gate = (-F.relu(-v)).exp()
        # λ = 0 holds the slab at the prior N(0, 1) during spike pre-training.
        slab_loc, slab_scale = self.slab_weight * loc, (0.5 * self.slab_weight * log_variance).exp()
        return SpikeAndSlab(
            gate,
            slab_loc,
            slab_scale,
            slope=self.slope.item(),
            spike_estimator=self.spike_estimator,
            temperature=self.temperature.item(),
        ).to_event(1)
