from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

from jaxloader.errors import CollateError
from jaxloader.tree import flatten, gather, leaf_paths, structure, unflatten

Point = namedtuple("Point", "x y")


def test_round_trip_of_every_container():
    tree = {"a": [1, (2, 3)], "b": Point(4, {"c": 5}), "d": np.zeros(2)}
    leaves, treedef = flatten(tree)
    assert leaves[:5] == [1, 2, 3, 4, 5]
    rebuilt = unflatten(treedef, leaves)
    assert type(rebuilt["b"]) is Point and rebuilt["a"][1] == (2, 3)
    assert leaf_paths(treedef) == ["['a'][0]", "['a'][1][0]", "['a'][1][1]", "['b'].x",
                                   "['b'].y['c']", "['d']"]


def test_gather_names_the_path_and_position_of_a_structure_mismatch():
    trees = [{"a": {"b": 1}}, {"a": {"c": 1}}]
    with pytest.raises(CollateError, match=r"\['a'\].*position 11.*position 12"):
        gather(trees, structure(trees[0]), positions=[11, 12])
