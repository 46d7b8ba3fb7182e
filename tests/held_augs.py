"""Augmentations as a project's own module holds them (tests/test_held_generators.py)."""

from __future__ import annotations

import random

import numpy as np

TRAIN = random.Random(11)  # one pipeline made as the module is imported: the same in each worker


class OneOf(list):
    """A list of augmentations that picks one with a generator of its own (imgaug's ``OneOf``
    is such a list)."""

    def __init__(self, *choices):
        super().__init__(choices)
        self.random_state = np.random.default_rng(0)

    def __call__(self, record):
        return self[int(self.random_state.integers(len(self)))](record)
