"""The convolutional encoder and generator of Fallah & Rozell (2022), Table 5, for 28x28 images."""

from torch import nn

from pyro_sparse.nn.networks import Decoder, FeatureAffine


def _check_image_28(num_features):
    if num_features != 28 * 28:
        raise ValueError(f"the conv networks are for 28x28 images (784 features), got {num_features} features")


class ConvEncoder28(nn.Module):
    """
    The encoder of Fallah & Rozell (2022) Table 5 for 28x28 images: four
    4x4 convolutions (64, 64, 128, 64 channels; strides 2, 2, 1, 2) with
    BatchNorm and ReLU, flattened (64 x 2 x 2) and mapped linearly to
    ``out_dim``.  (The table's garbled last rows list a 128-wide output; we end
    in a linear layer to whatever the guide needs.)
    """

    def __init__(self, num_features, out_dim):
        super().__init__()
        _check_image_28(num_features)

        def block(cin, cout, stride, pad):
            return [nn.Conv2d(cin, cout, 4, stride, pad), nn.BatchNorm2d(cout), nn.ReLU()]

        self.net = nn.Sequential(
            *block(1, 64, 2, 1), *block(64, 64, 2, 1), *block(64, 128, 1, 0), *block(128, 64, 2, 1),
            nn.Flatten(), nn.Linear(64 * 2 * 2, out_dim),
        )

    def forward(self, x):
        batch_shape = x.shape[:-1]
        out = self.net(x.reshape(-1, 1, 28, 28))
        return out.reshape(*batch_shape, -1)


class ConvDecoder28(Decoder):
    """
    The generator of Fallah & Rozell (2022) Table 5: a linear layer to 128
    units, then transposed 4x4 convolutions 128 -> 64 -> 64 -> 1 (4x4 -> 7x7
    -> 14x14 -> 28x28) with BatchNorm and ReLU.  The table's final sigmoid is
    replaced by the feature affine map (standardised units), as for the other
    decoders, so one network serves unit-norm and [0, 1] images and, with a
    Bernoulli likelihood, returns logits.
    """

    def __init__(self, num_features, latent_dim):
        super().__init__()
        _check_image_28(num_features)

        def block(cin, cout, stride, pad):
            return [nn.ConvTranspose2d(cin, cout, 4, stride, pad), nn.BatchNorm2d(cout), nn.ReLU()]

        self.input = nn.Sequential(nn.Linear(latent_dim, 128), nn.ReLU())
        self.net = nn.Sequential(
            *block(128, 128, 2, 0), *block(128, 64, 1, 0), *block(64, 64, 2, 1),
            nn.ConvTranspose2d(64, 1, 4, 2, 1), nn.Flatten(),
        )
        self.output_affine = FeatureAffine(num_features)

    def forward(self, z):
        batch_shape = z.shape[:-1]
        h = self.input(z.reshape(-1, z.shape[-1])).reshape(-1, 128, 1, 1)
        return self.output_affine(self.net(h)).reshape(*batch_shape, -1)
