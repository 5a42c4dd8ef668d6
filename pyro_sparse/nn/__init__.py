"""Plain torch networks: encoders and decoders, the sparse masked decoder, the observation model, device and precision settings."""

from pyro_sparse.nn.conv import (
    ConvDecoder28,
    ConvEncoder28,
)
from pyro_sparse.nn.masked import (
    DecoderMemoryError,
    MaskedDecoder,
    available_memory_bytes,
    check_step_memory,
)
from pyro_sparse.nn.networks import (
    Decoder,
    DenseDecoder,
    FeatureAffine,
    HeteroscedasticDecoder,
    evaluation_mode,
    mlp,
    with_covariates,
)
from pyro_sparse.nn.observation import (
    DISPERSIONS,
    ObservationModel,
    check_library_source,
)
from pyro_sparse.nn.precision import (
    PRECISIONS,
    check_precision,
    resolve_device,
    set_decoder_precision,
    tf32_matmuls,
)

__all__ = [
    "ConvDecoder28",
    "ConvEncoder28",
    "DISPERSIONS",
    "Decoder",
    "DecoderMemoryError",
    "DenseDecoder",
    "FeatureAffine",
    "HeteroscedasticDecoder",
    "MaskedDecoder",
    "ObservationModel",
    "PRECISIONS",
    "available_memory_bytes",
    "check_library_source",
    "check_precision",
    "check_step_memory",
    "evaluation_mode",
    "mlp",
    "resolve_device",
    "set_decoder_precision",
    "tf32_matmuls",
    "with_covariates",
]
