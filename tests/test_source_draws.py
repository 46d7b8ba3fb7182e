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


class _Seeded(_GlobalFlip):  # a generator it holds, seeded from the record: no draw of its own
    def __init__(self):
        self.rs = np.random.RandomState(0)

    def __getitem__(self, i):
        self.rs.seed(i)
        return {"image": np.arange(6, dtype=np.uint8).reshape(2, 3) + np.uint8(
            self.rs.randint(0, 9))}


def test_a_source_seeding_its_generator_from_the_record_is_not_said_to_draw():
    # its generator moved on the first read only (it was elsewhere before): said to draw,
    # its content hash lost (the review)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with jl.DataLoader(_Seeded(), batch_size=4, **ONE) as loader:
            next(iter(loader))
            assert not loader.state_dict()["record_hash"].startswith("drawn ")


@pytest.mark.parametrize("saved_drawn", [True, False])
def test_a_state_named_drawn_or_not_by_another_runs_reads_restores(monkeypatch, saved_drawn):
    # another thread drawing as the first state was made (a Map on the device-put thread)
    # named a source that draws nothing 'drawn', and every restore refused it (the review)
    from jaxloader.sources import fingerprint

    first_read = fingerprint._first_read
    monkeypatch.setattr(fingerprint, "_first_read",
                        lambda source: (*first_read(source)[:2], saved_drawn))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with jl.DataLoader(_Seeded(), batch_size=4, **ONE) as loader:
            state = loader.state_dict()
    assert state["record_hash"].startswith("drawn ") == saved_drawn
    monkeypatch.setattr(fingerprint, "_first_read",
                        lambda source: (*first_read(source)[:2], not saved_drawn))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with jl.DataLoader(_Seeded(), batch_size=4, **ONE) as again:
            again.load_state_dict(state)
    with pytest.raises(jl.StateDictError, match="record"):  # (other data: still refused)
        with jl.DataLoader(_GlobalFlip(), batch_size=4, **ONE) as other:
            other.load_state_dict({**state, "record_hash": state["record_hash"][:-4] + "0000"})
