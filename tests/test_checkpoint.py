"""Orbax checkpointing of the loader: both APIs, other process counts, incompatible loaders."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import threading

import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath
from orbax.checkpoint.experimental import v1 as ocp_v1

import jaxloader as jl
from jaxloader import checkpoint
from jaxloader.checkpoint import LoaderRestore, LoaderSave, read_state, write_state
from jaxloader.loaders import state_files
from launch import run_hosts
from resume_harness import assert_same_stream, take

pytestmark = pytest.mark.timeout(240)
HERE = os.path.dirname(os.path.abspath(__file__))


def make(batch_size=4, seed=0, process_index=0, process_count=1, **kw):
    source = jl.ArraySource({"x": np.arange(50.0), "y": np.arange(50)})
    return jl.DataLoader(source, batch_size=batch_size, shuffle=True, seed=seed,
                         num_epochs=None, process_index=process_index,
                         process_count=process_count, **kw)


def test_classic_manager_round_trip_continues_exactly(tmp_path):
    state = {"w": np.arange(3.0)}
    with make() as loader:
        take(loader, 7)
        manager = ocp.CheckpointManager(tmp_path)
        manager.save(7, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                loader=LoaderSave(loader)))
        manager.wait_until_finished()
        expected = take(loader, 5)
    assert "process_0-of-1.json" in os.listdir(tmp_path / "7" / "loader")
    with make() as fresh:
        restored = manager.restore(7, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(state), loader=LoaderRestore(fresh)))
        assert restored["loader"]["step"] == 7 and fresh.step == 7
        assert_same_stream(take(fresh, 5), expected)


def test_a_warning_of_a_restore_through_orbax_names_the_users_line(tmp_path):
    # it named a line of jaxloader's, called by Orbax's: Python's default filter then said it
    # once a process, however many restores under other transforms
    with make() as loader:
        take(loader, 3)
        manager = ocp.CheckpointManager(tmp_path)
        manager.save(3, args=ocp.args.Composite(loader=LoaderSave(loader)))
        manager.wait_until_finished()
    with make(transforms=[jl.Map(lambda r: r)]) as other:
        with pytest.warns(UserWarning, match="transforms differ") as said:
            manager.restore(3, args=ocp.args.Composite(loader=LoaderRestore(other)))
    assert {w.filename for w in said if "transforms differ" in str(w.message)} == {__file__}


def test_v1_checkpointables_round_trip(tmp_path):
    with make(num_workers=1) as loader:
        take(loader, 3)
        ocp_v1.save_checkpointables(tmp_path / "ckpt", {"loader": loader,
                                                        "state": {"w": np.ones(2)}})
        expected = take(loader, 4)
    with make(num_workers=0) as fresh:
        ocp_v1.load_checkpointables(tmp_path / "ckpt", {"loader": fresh,
                                                        "state": {"w": np.ones(2)}})
        assert_same_stream(take(fresh, 4), expected)


def _saved_at(tmp_path, step):
    """A manager over ``tmp_path`` holding a loader-only checkpoint at ``step``."""
    with make() as loader:
        take(loader, step)
        manager = ocp.CheckpointManager(tmp_path)
        manager.save(step, args=ocp.args.Composite(loader=LoaderSave(loader)))
        manager.wait_until_finished()
    return manager


def test_an_incompatible_loader_is_refused_with_the_differences(tmp_path):
    manager = _saved_at(tmp_path, 2)
    with make(batch_size=5, seed=9) as other, pytest.raises(jl.StateDictError) as e:
        manager.restore(2, args=ocp.args.Composite(loader=LoaderRestore(other)))
    msg = str(e.value)
    assert "global_batch_size: expected 5, received 4" in msg and "seed: expected 9" in msg


def test_a_v1_load_into_an_incompatible_loader_raises_the_state_error_itself(tmp_path):
    # Orbax v1 turns an error raised in the awaitable load() returns into a NoEntryError about
    # handler registries, jaxloader's message only its cause: `except StateDictError` missed it
    with make() as loader:
        take(loader, 3)
        ocp_v1.save_checkpointables(tmp_path / "ckpt", {"loader": loader})
    with make(seed=9) as other, pytest.raises(jl.StateDictError, match=r"ckpt/loader: state "
                                                                       r"does not fit this "
                                                                       r"loader \(seed: "
                                                                       r"expected 9"):
        ocp_v1.load_checkpointables(tmp_path / "ckpt", {"loader": other})


def test_one_file_per_process_and_restore_into_another_process_count(tmp_path):
    hosts = [make(batch_size=2, process_index=p, process_count=2) for p in range(2)]
    for loader in hosts:
        take(loader, 6)
        write_state(tmp_path, loader)
    assert sorted(os.listdir(tmp_path)) == ["process_0-of-2.json", "process_1-of-2.json"]
    single = make(batch_size=4)
    assert read_state(tmp_path, single)["step"] == 6
    from jaxloader.checkpoint import restore_into

    restore_into(tmp_path, single)
    reference = take(make(batch_size=4), 10)[6:]
    assert_same_stream(take(single, 4), reference)
    with pytest.raises(jl.StateDictError, match="process_<i>-of-<n>.json"):
        read_state(tmp_path / "missing", single)


def _run(root, nproc: int, mode: str) -> None:
    run_hosts(os.path.join(HERE, "checkpoint_run.py"), nproc,
              [str(nproc), "{port}", str(root), mode])


@pytest.mark.e2e
def test_two_process_checkpoints_restore_into_one_and_two_processes(tmp_path):
    _run(tmp_path, 2, "save")
    expected = np.load(tmp_path / "expected.npy")
    assert sorted(os.listdir(tmp_path / "v1" / "loader")) == ["process_0-of-2.json",
                                                               "process_1-of-2.json"]
    for nproc in (1, 2):
        _run(tmp_path, nproc, "restore")
        for api in ("classic", "v1"):
            got = np.load(tmp_path / f"{api}_into_{nproc}.npy")
            assert np.array_equal(got, expected), f"{api} into {nproc} process(es)"


def test_an_epath_directory_works_for_both_apis(tmp_path):
    root = epath.Path(tmp_path)
    with make() as loader:
        take(loader, 3)
        manager = ocp.CheckpointManager(root / "classic")
        manager.save(3, args=ocp.args.Composite(loader=LoaderSave(loader)))
        manager.wait_until_finished()
        write_state(root, loader)
        expected = take(loader, 4)
    assert read_state(root, make())["step"] == 3
    with make() as fresh:
        manager.restore(3, args=ocp.args.Composite(loader=LoaderRestore(fresh)))
        assert_same_stream(take(fresh, 4), expected)


class _Awaiting:
    """Stands for Orbax's PathAwaitingCreation."""

    def __init__(self, path):
        self.path = path

    async def await_creation(self):
        return self.path


def test_v1_save_and_load_let_other_coroutines_run_during_file_io(tmp_path, monkeypatch):
    io_started, other_ran = threading.Event(), threading.Event()

    def slow(real):
        def io(*args):
            io_started.set()  # a write that blocked the event loop would wait here in vain
            assert other_ran.wait(10), "no other coroutine ran while the file was written/read"
            return real(*args)
        return io

    monkeypatch.setattr(state_files, "write_state", slow(state_files.write_state))
    monkeypatch.setattr(state_files, "read_state", slow(state_files.read_state))

    async def other():
        while not io_started.is_set():
            await asyncio.sleep(0.001)
        other_ran.set()

    async def save_and_load(loader, fresh):
        await asyncio.gather(await loader.save(_Awaiting(tmp_path)), other())
        io_started.clear(), other_ran.clear()
        loaded, _ = await asyncio.gather(fresh.load(tmp_path), other())  # (read in load())
        await loaded

    with make() as loader, make() as fresh:
        take(loader, 5)
        asyncio.run(save_and_load(loader, fresh))
        assert fresh.step == 5 and os.listdir(tmp_path) == ["process_0-of-1.json"]


def _v1_training_run(path, total: int, crash_after: int | None = None):
    """docs/checkpointing.md's Orbax v1 loop: save every 5 steps, resume from the latest checkpoint."""
    state, seen = {"w": np.zeros(3)}, []
    policy = ocp_v1.training.save_decision_policies.FixedIntervalPolicy(5)
    with make() as loader, ocp_v1.training.Checkpointer(
            path, save_decision_policy=policy) as checkpointer:
        start = 0
        if checkpointer.latest is not None:
            start = checkpointer.latest.step
            restored = checkpointer.load_checkpointables(start, {"state": state, "loader": loader})
            state = restored["state"]
        batches = iter(loader)
        for step in range(start, total):
            batch = next(batches)
            seen.append(batch["x"].copy())
            state = {"w": state["w"] + batch["x"][:3]}
            checkpointer.save_checkpointables(step + 1, {"state": state, "loader": loader})
            if step + 1 == crash_after:
                break
    return start, seen, state


def test_v1_training_checkpointer_loop_resumes_from_the_latest_step(tmp_path):
    _, whole, whole_state = _v1_training_run(tmp_path / "whole", 17)
    _v1_training_run(tmp_path / "cut", 17, crash_after=13)
    start, rest, state = _v1_training_run(tmp_path / "cut", 17)
    assert start == 10  # the latest save at or before the crash
    assert_same_stream(rest, whole[10:])
    assert np.array_equal(state["w"], whole_state["w"])


def test_a_truncated_state_file_is_an_error_naming_the_file_and_the_step(tmp_path):
    manager = _saved_at(tmp_path, 3)
    saved = tmp_path / "3" / "loader" / "process_0-of-1.json"
    for damaged in (saved.read_text()[:40],  # a copy that stopped
                    "[" * 100_000):  # (a RecursionError, which named no file)
        saved.write_text(damaged)
        with make() as fresh, pytest.raises(jl.StateDictError, match=r"checkpoint .*3/loader/"
                                                                      r"process_0-of-1.json "
                                                                      r"\(step 3\): the "
                                                                      r"loader's state is not "
                                                                      r"whole JSON"):
            manager.restore(3, args=ocp.args.Composite(loader=LoaderRestore(fresh)))
    for damaged in ("null", "[1, 2]"):  # whole JSON, not a state's: "state: expected a dict
        saved.write_text(damaged)  # ..., got NoneType", no file named (the Orbax audit)
        with make() as fresh, pytest.raises(jl.StateDictError, match=r"process_0-of-1.json "
                                                                      r"\(step 3\): the "
                                                                      r"loader's state is JSON "
                                                                      r"of a (NoneType|list).*"
                                                                      r"restore an earlier"):
            manager.restore(3, args=ocp.args.Composite(loader=LoaderRestore(fresh)))


def test_a_save_to_a_full_disk_names_the_path(tmp_path):
    (tmp_path / "process_0-of-1.json").symlink_to("/dev/full")  # every write: ENOSPC
    with make() as loader, pytest.raises(OSError, match=r"checkpoint: cannot write the "
                                                        r"loader's state to .*process_0-of-1"
                                                        r"\.json \(No space left on device\)"
                                                        r"; free space") as caught:
        checkpoint.LoaderCheckpointHandler().save(tmp_path, args=LoaderSave(loader))
    assert caught.value.errno == 28
    # a read-only mount was told to free space (the disk-full audit)
    from etils import epath

    def read_only(self, text):
        raise OSError(30, "Read-only file system")
    with make() as loader, pytest.MonkeyPatch.context() as patch, pytest.raises(
            OSError, match=r"\(Read-only file system\); save the checkpoint to a directory "
                           r"this process may write"):
        patch.setattr(epath.Path, "write_text", read_only)
        checkpoint.write_state(tmp_path / "elsewhere", loader)
    (tmp_path / "a_file").write_text("")  # (a file given for the folder: told to free
    with make() as loader, pytest.raises(OSError, match=r"\(Not a directory\); pass a directory"
                                                        r": .*a_file or a folder above it is a "
                                                        r"file"):  # space; the errors audit)
        checkpoint.write_state(tmp_path / "a_file", loader)
    (tmp_path / "taken" / "process_0-of-1.json").mkdir(parents=True)  # (a folder in the
    with make() as loader, pytest.raises(OSError, match=r"process_0-of-1.json is a folder: "
                                                        r"remove or rename it"):  # file's place)
        checkpoint.write_state(tmp_path / "taken", loader)


@pytest.mark.filterwarnings("ignore:coroutine '_create_paths' was never awaited")  # (Orbax
# v1's own folder-making, left when the iterator's save raised)
def test_an_iterator_given_for_the_loader_is_refused_with_the_remedy(tmp_path):
    # Grain's CheckpointSave(iterator) idiom: an AttributeError deep in the handler
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, process_index=0,
                       process_count=1) as loader:
        for args in (LoaderSave, LoaderRestore):
            with pytest.raises(jl.ConfigError, match=rf"{args.__name__}\(loader\): expected a "
                                                     r"DataLoader .*got LoaderIterator; pass "
                                                     r"the loader itself, not iter\(loader\)"):
                args(iter(loader))
        # a state_dict() given: told to pass the loader "not iter(loader)", which it was not
        with pytest.raises(jl.ConfigError, match=r"got dict; pass the loader itself, not its "
                                                 r"state_dict\(\).*load_state_dict\(state\)"):
            LoaderRestore(loader.state_dict())

        # the v1 API took the iterator for a pytree: Orbax's handler errors, not the remedy
        path = epath.Path(tmp_path) / "v1"
        with pytest.raises(jl.ConfigError, match=r"got LoaderIterator; pass the loader itself"):
            ocp_v1.save_checkpointables(path, {"loader": iter(loader)})
        ocp_v1.save_checkpointables(path, {"loader": loader})
        with pytest.raises(jl.ConfigError, match=r"load_state_dict\(\)\), got LoaderIterator; "
                                                 r"pass the loader itself"):
            ocp_v1.load_checkpointables(path, {"loader": iter(loader)})
    gc.collect()  # (Orbax's coroutine warned of here, where the filter above holds)


def test_the_checkpoint_module_is_an_attribute_of_the_package():
    # the docs name jaxloader.checkpoint.LoaderSave: after `import jaxloader` alone, it said
    # "module 'jaxloader' has no attribute 'checkpoint'"
    import subprocess
    import sys

    said = subprocess.run([sys.executable, "-c", "import jaxloader as jl; "
                           "print(jl.checkpoint.LoaderSave.__name__, jl.ray.__name__)"],
                          capture_output=True, text=True, timeout=120)
    assert said.stdout.split() == ["LoaderSave", "jaxloader.ray"], said.stderr


_UNWRITABLE = """
import os, shutil, sys, numpy as np, jax.numpy as jnp, orbax.checkpoint as ocp
import jaxloader as jl
from jaxloader.checkpoint import LoaderSave
root = sys.argv[1]
loader = jl.DataLoader(jl.ArraySource({"i": np.arange(64)}), batch_size=4, num_epochs=None)
manager = ocp.CheckpointManager(root)
shutil.rmtree(root)
open(root, "w").close()  # (a file where the checkpoints were: a step's folder cannot be made)
try:
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": jnp.ones(3)}),
                                            loader=LoaderSave(loader)))
    manager.wait_until_finished()
    print("saved")
except Exception as e:
    print("raised", type(e).__name__, e)
loader.close()
os._exit(0)
"""


def test_a_save_whose_step_folder_cannot_be_made_raises_rather_than_waits(tmp_path):
    # Orbax waits, before a synchronous handler's save, for the step's folder to be made:
    # where making it failed (a read-only or full disk) the save waited for good, deaf to a
    # Ctrl-C; the model's item alone raised. The loader's handler is asynchronous, as Orbax's
    import subprocess
    import sys

    said = subprocess.run([sys.executable, "-c", _UNWRITABLE, str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=100,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert said.stdout.startswith("raised NotADirectoryError"), (said.stdout, said.stderr[-2000:])


def test_a_folder_reused_by_runs_on_two_process_counts_keeps_the_last_runs_states(tmp_path):
    # write_state into one reused folder: a run on one process at step 2, then on two at step
    # 6; a restore on one process read its own, older file (4 batches again, unsaid)
    single = make(batch_size=4)
    take(single, 2)
    write_state(tmp_path, single)
    hosts = [make(batch_size=2, process_index=p, process_count=2) for p in range(2)]
    for loader in hosts:
        take(loader, 6)
        write_state(tmp_path, loader)
    assert sorted(os.listdir(tmp_path)) == ["process_0-of-2.json", "process_1-of-2.json"]
    assert read_state(tmp_path, make(batch_size=4))["step"] == 6
    take(single, 5)
    write_state(tmp_path, single)  # (resized back: the two states are its past)
    assert sorted(os.listdir(tmp_path)) == ["process_0-of-1.json"]
    assert read_state(tmp_path, hosts[0])["step"] == 7
    for loader in hosts:  # (a state at a later step, a run saving there meanwhile, is left:
        write_state(tmp_path, loader)  # not its past, and the folder refused)
    with pytest.warns(jl.JaxloaderWarning, match=r"at a later step, 7 \(process_0-of-1.json\), "
                                                 r"beside this one at 6: read_state refuses"):
        write_state(tmp_path, hosts[0])  # (said where it is written: a rollback's save)
    assert len(os.listdir(tmp_path)) == 3
    with pytest.raises(jl.StateDictError, match="runs on 2 process counts"):
        read_state(tmp_path, single)
    for loader in hosts:  # (at one step: one position, which any of them restores)
        take(loader, 1)
        write_state(tmp_path, loader)
    assert len(os.listdir(tmp_path)) == 3 and read_state(tmp_path, single)["step"] == 7


def test_a_folder_holding_the_states_of_runs_on_two_process_counts_is_refused(tmp_path):
    # (written so before write_state removed the other count's states)
    for loader in [make(batch_size=2, process_index=p, process_count=2) for p in range(2)]:
        take(loader, 6)
        write_state(tmp_path, loader)
    single = make(batch_size=4)
    take(single, 2)
    (tmp_path / "process_0-of-1.json").write_text(json.dumps(single.state_dict()))
    with pytest.raises(jl.StateDictError, match=r"runs on 2 process counts \(1 process\(es\), "
                                                r"process_0-of-1\.json: step 2; 2 process\(es\)"
                                                r", process_0-of-2\.json: step 6\).*folder of "
                                                "its own"):
        read_state(tmp_path, make(batch_size=4))
    os.remove(tmp_path / "process_0-of-1.json")
    assert read_state(tmp_path, make(batch_size=4))["step"] == 6


def test_a_grain_iterators_state_is_told_for_what_it_is(tmp_path):
    # Grain's Orbax handler writes the same file name: its state was refused as missing keys,
    # told to pass the dict state_dict() returned
    grains = {"version": 2, "last_seen_indices": {"0": 95}, "last_worker_index": 0,
              "worker_count": 0, "sampler": "IndexSampler(...)", "data_source": "..."}
    from jaxloader.checkpoint import restore_into

    # (and a dataset iterator's, a prefetched one's: the migration audit)
    for state in (grains, {"next_index": 95}, {"workers_state": {}, "iterations_to_skip": {},
                                               "last_worker_index": 0}):
        (tmp_path / "process_0-of-1.json").write_text(json.dumps(state))
        with pytest.raises(jl.StateDictError, match=r"a Grain iterator's state.*state\['step'\] "
                                                    r"= n"):
            restore_into(tmp_path, make(batch_size=4))
        # given straight to load_state_dict (read by hand from Grain's file): told the same
        for loader, then in ((make(batch_size=4), r"state\['step'\] = n"), (jl.StreamLoader(
                jl.Stream.from_generator(lambda shard: range(8), shards=1), batch_size=4,
                process_index=0, process_count=1), r"start the stream loader afresh")):
            # (a StreamLoader was told to set its step, which it refuses: the review)
            with pytest.raises(jl.StateDictError, match=r"a Grain iterator's state.*" + then):
                loader.load_state_dict(state)


def test_a_steps_folder_given_for_its_loader_items_is_told_the_items_folder(tmp_path):
    (tmp_path / "loader").mkdir()
    write_state(tmp_path / "loader", make(batch_size=4))
    with pytest.raises(jl.StateDictError, match=r"a checkpoint step's folder: pass its item's, "
                                                r".*/loader\)"):
        read_state(tmp_path, make(batch_size=4))


def test_loaders_of_each_hosts_own_keep_a_state_file_each(tmp_path, monkeypatch):
    # process_count=1 on each of 2 hosts (each host's own data, as the docs advise for it): both
    # wrote process_0-of-1.json, and host 0 restored host 1's position, records skipped without
    # a word (the multi-host audit)
    import jax

    from jaxloader.loaders.state_files import read_state, write_state

    from jaxloader.loaders import state_files

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(state_files, "jax_started", lambda: True)
    states = {}
    for host, data in ((0, np.arange(10)), (1, np.arange(100, 140))):
        monkeypatch.setattr(jax, "process_index", lambda host=host: host)
        loader = jl.DataLoader(jl.ArraySource({"x": data}), batch_size=2, shuffle=False,
                               process_index=0, process_count=1)
        for _, _batch in zip(range(host + 1), loader):
            pass
        write_state(tmp_path, loader)
        states[host] = (loader, loader.state_dict())
    assert sorted(os.listdir(tmp_path)) == ["process_0-of-1.host0-of-2.json",
                                            "process_0-of-1.host1-of-2.json"]
    for host, (loader, state) in states.items():
        monkeypatch.setattr(jax, "process_index", lambda host=host: host)
        assert read_state(tmp_path, loader) == state
    later = states[1][0]  # (a run on 3 hosts saving there later: the 2 hosts' files go)
    next(iter(later))
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    write_state(tmp_path, later)
    assert sorted(os.listdir(tmp_path)) == ["process_0-of-1.host1-of-3.json"]
    (tmp_path / "process_0-of-1.host0-of-2.json").write_text(json.dumps(states[0][1]))
    with pytest.raises(jl.StateDictError, match=r"runs on 2 process counts"):  # (at another
        read_state(tmp_path, later)  # step: which run to continue is not known)
    for name in os.listdir(tmp_path):
        os.remove(tmp_path / name)
    for host, (loader, state) in states.items():
        monkeypatch.setattr(jax, "process_index", lambda host=host: host)
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        write_state(tmp_path, loader, state)
    monkeypatch.setattr(jax, "process_count", lambda: 3)  # (another host count: refused)
    with pytest.raises(jl.StateDictError, match=r"loaders of their own on each of 2 JAX "
                                                r"processes .*restore on as many processes"):
        read_state(tmp_path, states[0][0])
    # a loader of several processes keeps the one file of its process (elastic across counts:
    # the suffix refused a restore of 2 processes' on 4, the review), and JAX not started is
    # not asked (its runtime started, jax.distributed.initialize() failed after a save)
    shared = jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=2, shuffle=False,
                           process_index=1, process_count=2)
    assert state_files.state_filename(shared) == "process_1-of-2.json"
    monkeypatch.setattr(state_files, "jax_started", lambda: False)
    assert state_files.state_filename(states[0][0]) == "process_0-of-1.json"
    for loader in (shared, states[0][0], states[1][0]):
        loader.close()


def test_the_files_of_a_run_on_another_process_count_at_other_steps_are_refused(tmp_path):
    # two processes saved at different steps (one took a batch more): a restore on one process
    # read process 0's, step 3, without a word (on two, iter() refuses it)
    for p, steps in ((0, 3), (1, 4)):
        loader = make(batch_size=2, process_index=p, process_count=2)
        take(loader, steps)
        write_state(tmp_path, loader)
    with pytest.raises(jl.StateDictError, match=r"the 2 processes that saved it hold the loader "
                                                r"at other steps \(process_0-of-2\.json: step 3; "
                                                r"process_1-of-2\.json: step 4\).*restore on 1 "
                                                r"process\(es\) cannot tell"):
        read_state(tmp_path, make(batch_size=4))
    loader = make(batch_size=2, process_index=0, process_count=2)
    take(loader, 4)
    write_state(tmp_path, loader)
    assert read_state(tmp_path, make(batch_size=4))["step"] == 4
