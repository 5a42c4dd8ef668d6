"""The library version, recorded in model files and checkpoints."""

__version__ = "0.1.0"
