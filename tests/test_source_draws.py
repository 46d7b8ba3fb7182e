"""A source that draws random numbers as it reads (an augmentation in ``__getitem__``, the
PyTorch ``RandomHorizontalFlip`` port): said at the first state however its draws fall, and its
states restore (they name its data by the records' structure: their values are drawn)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import jaxloader as jl

ONE = {"process_index": 0, "process_count": 1}


class _GlobalFlip:  # a coin from NumPy's global state: record 0 read twice agrees half the time
    def __len__(self):
        return 16

    def __getitem__(self, i):
        image = np.arange(6, dtype=np.uint8).reshape(2, 3) + i
        return {"image": image[:, ::-1].copy() if np.random.random() < 0.5 else image}


class _HeldFlip(_GlobalFlip):  # a coin from a generator the source holds
    def __init__(self):
        self.rng = np.random.default_rng(7)

    def __getitem__(self, i):
        image = np.arange(6, dtype=np.uint8).reshape(2, 3) + i
        return {"image": image[:, ::-1].copy() if self.rng.random() < 0.5 else image}


@pytest.mark.parametrize("kind", [_GlobalFlip, _HeldFlip])
def test_a_source_drawing_as_it_reads_is_said_and_its_states_restore_whatever_it_drew(kind):
    where = "the global random state" if kind is _GlobalFlip else "a random generator it holds"
    for seed in range(8):  # (some seeds' draws agreed: nothing said, the restore refused)
        np.random.seed(seed)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with jl.DataLoader(kind(), batch_size=4, **ONE) as loader:
                it = iter(loader)
                next(it)
                state = loader.state_dict()
        told = [str(w.message) for w in said if "__getitem__" in str(w.message)]
        assert len(told) == 1 and where in told[0] and "RandomMap" in told[0], (seed, told)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with jl.DataLoader(kind(), batch_size=4, **ONE) as again:
                again.load_state_dict(state)  # (was refused: "alike in structure, not values")
                assert next(iter(again))["image"].shape == (4, 2, 3)


def test_a_source_of_another_structure_is_still_refused_though_it_draws():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with jl.DataLoader(_GlobalFlip(), batch_size=4, **ONE) as loader:
            state = loader.state_dict()

        class Wider(_GlobalFlip):
            def __getitem__(self, i):
                return {"image": np.zeros((2, 4), np.uint8) + np.uint8(np.random.random() < .5)}

        with jl.DataLoader(Wider(), batch_size=4, **ONE) as other:
            with pytest.raises(jl.StateDictError, match="record_spec"):
                other.load_state_dict(state)
