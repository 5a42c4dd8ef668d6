"""Pyro effect handlers and plates shared by models, guides and the loop."""

from pyro.poutine.messenger import Messenger

from pyro_sparse.plates import in_data_plate


class scale_local_latents(Messenger):
    """
    Multiply the scale of every latent (not observed) sample site inside the
    data plate by ``factor``, in the model and the guide alike, so the KL
    term of the local codes is weighted by ``factor`` while the likelihood
    and global priors are not: the KL warm-up of Bowman et al. (2016) and
    Sønderby et al. (2016).  Sites marked ``infer={"kl_warmup": False}`` (a
    latent library size, whose KL scVI also leaves out of the warm-up) keep
    their scale.
    """

    def __init__(self, factor):
        super().__init__()
        self.factor = factor

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["is_observed"] and in_data_plate(msg) \
                and msg["infer"].get("kl_warmup", True):
            msg["scale"] = msg["scale"] * self.factor
