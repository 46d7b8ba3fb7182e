"""Two hosts on this machine (jax.distributed, CPU backend) against one process, both ways."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from launch import run_hosts
from sharding.multihost_config import make_loader

pytestmark = [pytest.mark.timeout(240), pytest.mark.e2e]
HERE = os.path.dirname(os.path.abspath(__file__))
STEPS, SAVE_AT = 14, 5  # 90 records / global batch 8 = 12 steps an epoch: crosses a boundary


def _two_hosts(out_dir, steps: int, mode: str) -> None:
    pythonpath = os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])
    run_hosts(os.path.join(HERE, "multihost_run.py"), 2,
              ["{port}", str(out_dir), str(steps), mode], env={"PYTHONPATH": pythonpath})


def _single(steps: int, state: dict | None = None) -> dict:
    with make_loader(batch_size=8, process_index=0, process_count=1) as loader:
        if state is not None:
            loader.load_state_dict(state)
        it = iter(loader)
        batches = [next(it) for _ in range(steps)]
        return {"x": np.stack([b["x"] for b in batches]), "y": np.stack([b["y"] for b in batches]),
                "state": loader.state_dict()}


def test_two_hosts_give_the_single_process_stream_and_restore_both_ways(tmp_path):
    _two_hosts(tmp_path, STEPS, str(SAVE_AT))
    reference = _single(STEPS)
    got = np.load(tmp_path / "stream_5.npz")
    assert np.array_equal(got["y"], reference["y"])  # same records in the same places
    assert np.array_equal(got["x"], reference["x"])  # same RandomMap draws, bit for bit

    # two hosts -> one process: the state saved at step 5 continues the same global stream
    states = [json.loads((tmp_path / f"state_{i}.json").read_text()) for i in range(2)]
    assert states[0]["step"] == states[1]["step"] == SAVE_AT
    assert states[0]["process_count"] == 2 and states[0]["global_batch_size"] == 8
    tail = _single(STEPS - SAVE_AT, states[0])
    assert np.array_equal(tail["x"], reference["x"][SAVE_AT:])

    # one process -> two hosts
    (tmp_path / "resume_state.json").write_text(json.dumps(_single(SAVE_AT)["state"]))
    _two_hosts(tmp_path, STEPS - SAVE_AT, "resume")
    resumed = np.load(tmp_path / "stream_resume.npz")
    assert np.array_equal(resumed["x"], reference["x"][SAVE_AT:])
    assert np.array_equal(resumed["y"], reference["y"][SAVE_AT:])


def test_a_mesh_in_another_order_than_the_processes_gives_one_process_batches(tmp_path):
    # each host read the rows of its process_index, which JAX put on its own devices: with
    # the mesh's devices in another order (or a batch axis interleaving the hosts) the global
    # batch's rows came out permuted
    pythonpath = os.pathsep.join([os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])
    outs = run_hosts(os.path.join(HERE, "mesh_order_run.py"), 2, ["{port}"],
                     env={"PYTHONPATH": pythonpath})
    # (a loader made after jax.distributed.initialize() took each host for the only one)
    assert [[line for line in out.splitlines() if line.startswith("place ")] for out in outs] \
        == [["place 0 2"], ["place 1 2"]], outs
    lines = outs[0].splitlines()
    for name in ("in process order", "reversed", "interleaved"):
        assert lines.count(f"{name} same") == 3, outs[0]  # (plain, process_index=, workers)
    refused = [line for line in lines if line.startswith("refused:")]
    assert len(refused) == 1 and "gives this process's devices 8 rows of the global batch " \
        "of 8" in refused[0] and "not split across the processes" in refused[0], outs[0]
    # (its remedy, process_count=1 with sharding=, was refused in turn: sharding= dropped)
    assert "drop sharding= and pass process_index=0, process_count=1, batch_size=8, then " \
        "each step jax.make_array_from_process_local_data(sharding, batch)" in refused[0]
    two = [line for line in lines if line.startswith("two axes refused:")]  # (IndexError)
    assert len(two) == 1 and "cannot place batch leaf ['y']" in two[0] and "its spec names 2 " \
        "dimensions, the leaf has 1" in two[0], outs[0]
    one = [line for line in lines if line.startswith("one device refused:")]
    assert len(one) == 1 and "SingleDeviceSharding" in one[0] and "gives this process's " \
        "devices 8 rows of the global batch of 8" in one[0], outs[0]
    meshes = [line for line in lines if line.startswith("mixed meshes refused:")]
    assert len(meshes) == 1 and "one mesh (their specs are alike, P('data',), but their meshes " \
        "list the devices in another order)" in meshes[0], outs[0]
    # (accepted, its process_index said the other process's; both passing 0 were refused as
    # "both read the same rows", which they did not)
    swapped = [line for line in lines if line.startswith("swapped refused:")]
    assert len(swapped) == 1 and "process_index=1: this is JAX's process 0 of 2" in swapped[0] \
        and "pass jax.process_index()" in swapped[0], outs[0]
    for out in outs:  # a mesh of jax.local_devices(): said so; with process_count=1, placed
        local = [line for line in out.splitlines() if line.startswith("local mesh")]
        assert len(local) == 2 and "its mesh holds this process's devices alone (jax." \
            "local_devices()); make the mesh over every process's" in local[0], out
        assert local[1] == "local mesh by hand (4,) True", out
    for out in outs:  # (each process's mesh its own devices first: both read the same rows)
        own = [line for line in out.splitlines() if line.startswith("own meshes refused:")]
        assert len(own) == 1 and "differ at this iter() (meshes: process" in own[0] and (
            "the same mesh: spec, axes and the devices in one order" in own[0]), out
    for out, rows in zip(outs, (4, 2)):  # (a mesh of 2 devices of one process, 1 of the other)
        uneven = [line for line in out.splitlines() if line.startswith("uneven refused:")]
        assert len(uneven) == 1 and f"gives this process's devices {rows} rows of the global " \
            "batch of 6" in uneven[0] and "the processes hold unequal numbers of its devices " \
            "(process 0: 2, process 1: 1)" in uneven[0] and "not split" not in uneven[0], out
    mixed = [line for line in lines if line.startswith("mixed rows refused:")]
    assert len(mixed) == 1 and "leaf ['x'] puts this process's devices at rows 0-3 of the " \
        "global batch of 8, leaf ['y'] at rows 0, 1, 4, 5;" in mixed[0], outs[0]
