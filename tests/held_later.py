"""A project's augmentation module that a transform imports inside itself, so that a fresh
worker has not imported it before the transform's first call (tests/test_held_generators.py)."""

from __future__ import annotations

import numpy as np

NOISE = np.random.default_rng(5)  # made as a worker imports it: the same in each worker
