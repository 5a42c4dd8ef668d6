"""Amortized guides (encoders).  Installed as ``pyro_sparse.guides``."""

from pyro_sparse.guides.amortized_normal import AmortizedNormalGuide

__all__ = ["AmortizedNormalGuide"]
