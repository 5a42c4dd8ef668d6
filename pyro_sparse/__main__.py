"""``python -m pyro_sparse ...`` (and ``torchrun -m pyro_sparse ...``) runs the command line."""

import sys

from pyro_sparse.interop.cli import main

sys.exit(main())
