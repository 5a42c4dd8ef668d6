"""
Checks of a number a user passes: one definition for every layer (data,
distributions, priors, models, inference), so options are refused alike.
"""

import math
import numbers

import numpy as np


def is_count(value, minimum=1):
    """An integer (numpy's too, not a bool) of at least ``minimum``."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum


def positive_number(name, value):
    """
    ``value`` as a float if it is a finite positive real number (numpy's
    too, not a bool); else a ValueError naming ``name``.
    """
    if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < math.inf):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
