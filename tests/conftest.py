"""
Under pytest-xdist (``-n``) each worker trains on one thread: the workers
already share the cores, and the small models of the tests gain nothing from
intra-op threads fighting over them.  ``one_thread`` pins a test to one
thread and restores the count after it: bit-for-bit comparisons need the
same reduction order in every run (the benchmarks fit on one thread).
"""

import os

import pytest
import torch

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
