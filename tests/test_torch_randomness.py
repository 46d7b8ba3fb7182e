"""PyTorch in a loader's transforms and records (the PyTorch guide's audit): torchvision's random
transforms draw from torch's global generator, which workers forked from one process shared
and no watch saw (with start_method="fork" half of an epoch's augmentations were copies, with
the default other ones each run, without a word); a held ``torch.Generator`` went unseen too; a
tensor NumPy cannot take (bfloat16, one that requires grad) failed without its leaf or record.
Run where torch is installed (it is no test dependency: its wheel is gigabytes on most
Pythons)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import jaxloader as jl
from test_held_generators import ONE, _epoch  # (the values drawn over an epoch)

torch = pytest.importorskip("torch")


def _torch_draw(record):  # a torchvision random transform's draw
    return {**record, "aug": np.int64(torch.randint(0, 1 << 30, ()).item())}


class _Flip:  # an augmentation object with a torch.Generator of its own
    def __init__(self):
        self.g = torch.Generator().manual_seed(0)

    def __call__(self, record):
        return {**record, "aug": np.int64(torch.randint(0, 1 << 30, (), generator=self.g))}


def _seeded(record, rng):  # the remedy: torch seeded from the RandomMap's rng, then drawn
    torch.manual_seed(int(rng.integers(2**63)))
    return _torch_draw(record)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_draws_from_torchs_global_generator_are_warned_of(num_workers):
    _, said = _epoch([jl.Map(_torch_draw)], num_workers)
    found = [s for s in said if "drew from the global random state" in s]
    assert found and "torch.rand" in found[0] and "jl.RandomMap(" in found[0], said


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_held_torch_generator_is_warned_of_by_where_it_is(num_workers):
    drawn, said = _epoch([jl.Map(_Flip())], num_workers)
    found = [s for s in said if "random generator it holds" in s]
    assert found and "(fn.g)" in found[0], said


def test_torch_seeded_from_a_random_maps_rng_is_the_loaders_and_unsaid():
    drawn0, said0 = _epoch([jl.RandomMap(_seeded)], 0)
    drawn2, said2 = _epoch([jl.RandomMap(_seeded)], 2)
    np.testing.assert_array_equal(drawn0, drawn2)
    assert len(set(drawn0.tolist())) == 64
    assert not [s for s in said0 + said2 if "drew from" in s], said0 + said2


_FORKED = """
import numpy as np, sys, torch, jaxloader as jl
assert "jax" not in sys.modules  # (start_method="fork" is refused beside JAX)
def draw(record):
    return {**record, "aug": np.int64(torch.randint(0, 1 << 30, ()).item())}
with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8, transforms=[jl.Map(draw)],
                   num_workers=2, start_method="fork", process_index=0, process_count=1) as dl:
    print(len(set(np.concatenate([b["aug"] for b in dl]).tolist())))
"""


def test_workers_forked_draw_from_torch_states_of_their_own():
    # each forked worker kept the training process's torch state: 32 values of 64
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _FORKED], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["64"], out.stdout


class _Embeddings:
    def __init__(self, make):
        self.make = make

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return {"emb": self.make(i), "y": i}


@pytest.mark.parametrize("make, said", [
    (lambda i: torch.ones(3, dtype=torch.bfloat16) * i, "torch.bfloat16"),
    (lambda i: torch.ones(3, requires_grad=True) * i, "requires grad"),
])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_a_tensor_numpy_cannot_take_is_named_with_its_remedy(make, said, num_workers):
    loader = jl.DataLoader(_Embeddings(make), batch_size=4, num_workers=num_workers, **ONE)
    with loader, pytest.raises(Exception, match=r"batch leaf \['emb'\]: record position 0 is "
                                                r"a torch\.Tensor") as raised:
        next(iter(loader))
    assert said in str(raised.value) and "t.detach().cpu().numpy()" in str(raised.value)
