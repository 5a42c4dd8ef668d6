"""
Under pytest-xdist (``-n``) each worker trains on one thread: the workers
already share the cores, and the small models of the tests gain nothing from
intra-op threads fighting over them.
"""

import os

import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
