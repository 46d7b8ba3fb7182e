"""A loader's life in any order: iterate, break out, peek, save, restore, close, replace, drop.

A Hypothesis state machine drives one loader (a ``DataLoader`` or a ``StreamLoader``, with 0-2
workers, with and without device prefetch) through random sequences of what a training script
or a notebook does to it. After every call the position is the one the calls imply, every batch
handed out equals the uninterrupted stream's batch at its step, and a loader that is closed,
replaced or dropped without ``close()`` leaves no worker and no thread behind (the autouse
fixture checks segments and processes at the end). The lifecycle fuzzer these rules come from
found a loader dropped after a ``break`` keeping its workers through the device-put thread.
"""

from __future__ import annotations

import gc
import re
import warnings
import threading
import time

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import jaxloader as jl
from workers.shm_probe import running

pytestmark = [pytest.mark.timeout(600), pytest.mark.e2e]

N = 45  # records; a batch of 4 leaves a partial last one of 1


def shift(r, rng):
    return {"x": r["x"] + np.float32(rng.integers(1000)), "y": r["y"]}


def shard(i):
    for k in range(i, N, 2):
        yield {"x": np.full(3, k, np.float32), "y": np.int64(k)}


def make(kind: str, num_workers: int, device_prefetch: int):
    kw = dict(batch_size=4, seed=1, num_workers=num_workers, transforms=[jl.RandomMap(shift)],
              process_index=0, process_count=1)
    if device_prefetch:
        import jax

        kw.update(sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]),
                  device_prefetch=device_prefetch)
    if kind == "stream":
        return jl.StreamLoader(jl.Stream.from_generator(shard, shards=2, shuffle_window=5),
                               readers_per_process=2, num_epochs=1, **kw)
    source = jl.ArraySource({"x": np.repeat(np.arange(N, dtype=np.float32)[:, None], 3, 1),
                             "y": np.arange(N, dtype=np.int64)})
    return jl.DataLoader(source, shuffle=True, last_batch="partial", num_epochs=2, **kw)


_REFERENCES: dict[str, dict[int, dict]] = {}


def host(batch) -> dict:
    return {k: np.asarray(v).copy() for k, v in batch.items()}


def reference(kind: str) -> dict[int, dict]:
    """Step -> batch over the first passes, read in process in one go."""
    if kind not in _REFERENCES:
        with make(kind, 0, 0) as loader:
            ref = {}
            for _ in range(3):
                for batch in loader:
                    ref[loader.step - 1] = host(batch)
        _REFERENCES[kind] = ref
    return _REFERENCES[kind]


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if running(pid)]


def gone_soon(pids: list[int], seconds: float = 10.0) -> bool:
    """The workers exited and no jaxloader thread is left."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        gc.collect()
        ours = [t for t in threading.enumerate() if t.name.startswith("jaxloader")]
        if not alive(pids) and not ours:
            return True
        time.sleep(0.05)
    return False


class LoaderLife(RuleBasedStateMachine):
    loader: jl.DataLoader | jl.StreamLoader

    @initialize(kind=st.sampled_from(["array", "stream"]), workers=st.sampled_from([0, 0, 1, 2]),
                device_prefetch=st.sampled_from([0, 0, 2]))
    def start(self, kind, workers, device_prefetch):
        self.kind, self.device_prefetch = kind, device_prefetch
        self.ref = reference(kind)
        self.loader = make(kind, workers, device_prefetch)
        self.it = None
        self.step = 0  # where the loader must be
        self.saved: list[tuple[int, dict]] = []

    def check(self, step: int, batch) -> None:
        if step in self.ref:
            want = self.ref[step]
            got = host(batch)
            assert got.keys() == want.keys(), step
            for k in want:
                np.testing.assert_array_equal(got[k], want[k], err_msg=f"step {step} {k}")

    @rule(k=st.integers(1, 6))
    def take(self, k):
        if self.it is None:
            self.it = iter(self.loader)
        for _ in range(k):
            try:
                batch = next(self.it)
            except StopIteration:  # the pass ended; the next iter() starts the next one
                self.it = None
                return
            self.check(self.step, batch)
            self.step += 1

    @rule(k=st.integers(1, 4))
    def loop_and_break(self, k):
        self.it = None
        for i, batch in enumerate(self.loader):
            self.check(self.step, batch)
            self.step += 1
            if i + 1 == k:
                break

    @rule()
    def new_iterator(self):
        self.it = iter(self.loader)

    @rule()
    def peek(self):
        try:
            batch = self.loader.peek()
        except StopIteration:
            return
        self.check(self.step, batch)

    @rule()
    def save(self):
        self.saved.append((self.step, self.loader.state_dict()))

    @precondition(lambda self: self.saved)
    @rule(data=st.data())
    def restore(self, data):
        self.step, state = data.draw(st.sampled_from(self.saved))
        self.loader.load_state_dict(state)
        self.it = None

    @rule(workers=st.sampled_from([0, 1, 2]), drop=st.booleans())
    def replace(self, workers, drop):
        """A new loader resumes the old one's state; the old one is closed, or dropped."""
        state = self.loader.state_dict()
        pids = self.loader.worker_pids
        if drop:
            self.loader = self.it = None  # no close(): collected, as a notebook drops it
        else:
            self.loader.close()
            with pytest.raises(jl.JaxloaderError, match="closed"):
                iter(self.loader)
        assert gone_soon(pids), ("left", alive(pids), threading.enumerate())
        self.loader = make(self.kind, workers, self.device_prefetch)
        self.loader.load_state_dict(state)
        self.it = None

    @invariant()
    def at_its_step(self):
        if hasattr(self, "loader"):
            assert self.loader.step == self.step

    def teardown(self):
        if hasattr(self, "loader"):
            pids = self.loader.worker_pids
            self.loader.close()
            assert gone_soon(pids)


LoaderLife.TestCase.settings = settings(max_examples=10, stateful_step_count=12, deadline=None)
test_a_loader_in_any_order_of_calls = LoaderLife.TestCase


@pytest.mark.parametrize("how", ["load_state_dict", "iter"])
def test_a_restore_or_iter_from_another_thread_during_next_is_not_undone(how):
    # next() in one thread set the step after the other thread's load_state_dict() or iter():
    # the restore undone (the next iter() began past it), or one batch handed out twice
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(60)}), batch_size=3,
                           process_index=0, process_count=1)
    state = loader.state_dict()
    it = iter(loader)
    for _ in range(4):
        next(it)
    made, again = it._next, []

    def made_meanwhile():  # (another thread's call lands while this batch is made)
        batch = made()
        if how == "load_state_dict":
            loader.load_state_dict(state)
        else:
            again.append(iter(loader))
        return batch

    it._next = made_meanwhile
    with pytest.raises(jl.JaxloaderError, match="this iterator is stale"):
        next(it)
    expected = 0 if how == "load_state_dict" else 4
    assert loader.step == expected and loader.state_dict()["step"] == expected
    assert next(again[0] if again else iter(loader))["x"].tolist() == [
        3 * expected, 3 * expected + 1, 3 * expected + 2]
    loader.close()


def _numbers(shard):
    for i in range(1_000):
        yield {"x": np.int64(shard * 10_000 + i)}


@pytest.mark.parametrize("kind,options", [
    ("stream", dict(num_workers=2)), ("arrays", dict(num_workers=2)),
    ("stream", dict(num_workers="auto", readers_per_process=2)),
    ("stream", dict(num_workers=2, log_every_s=60)), ("arrays", dict(num_workers="auto"))])
def test_a_loader_dropped_after_its_first_batch_ends_its_workers_without_the_cycle_collector(
        kind, options):
    # a notebook's cell run again: a StreamLoader that had made an iterator held it, and the
    # iterator the loader (a cycle); any loader with num_workers='auto' or log_every_s= held
    # its monitor, and the monitor the loader: its workers ran on until the cycle collector did
    import weakref

    gc.disable()
    try:
        if kind == "stream":
            loader = jl.StreamLoader(jl.Stream.from_generator(_numbers, shards=2), batch_size=8,
                                     process_index=0, process_count=1, **options)
        else:
            loader = jl.DataLoader(jl.ArraySource({"x": np.arange(100)}), batch_size=8,
                                   process_index=0, process_count=1, **options)
        next(iter(loader))
        pids, dropped = loader.worker_pids, weakref.ref(loader)
        del loader
        assert dropped() is None
        deadline = time.monotonic() + 10
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(map(running, pids)), pids
    finally:
        gc.enable()


def test_many_loaders_with_workers_open_at_once_are_said_with_the_notebooks_remedy(
        monkeypatch):
    # a notebook keeps every loader a cell showed (Out[n]): re-running such a cell piled up
    # workers and descriptors until a new loader failed, with nothing said before
    from jaxloader.loaders import open_pools

    monkeypatch.setattr(open_pools, "MANY_OPEN", 2)
    made = []
    try:
        for expected in (False, True, False, True, False):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                made.append(jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                                          num_workers=1, process_index=0, process_count=1))
            said = [str(w.message) for w in caught if "loaders with workers" in str(w.message)]
            assert bool(said) is expected, (len(made), said)
            if said:
                assert re.search(rf"DataLoader \d+ \(ArraySource, batch_size 4\): {len(made)} "
                                 rf"loaders with workers are open in this process, with "
                                 rf"{len(made)} worker processes.*close\(\) the loaders.*"
                                 r"Out\[n\].*';'.*Out\[n\].close\(\).*%reset -f out then "
                                 r"get_ipython\(\).user_ns_hidden.update", said[0]), said
                assert caught[0].filename == __file__
        made.pop(0).close()  # (closed: not counted; the next makes 4 open again)
        made.pop(0).close()
        with pytest.warns(UserWarning, match=r": 4 loaders with workers are open"):
            made.append(jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                                      num_workers=1, process_index=0, process_count=1))
        for loader in made:
            loader.close()
        kept = []  # (a cell ending in `it`: the iterator keeps its dropped loader's workers)
        for expected in (False, True):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                kept.append(iter(jl.DataLoader(jl.ArraySource({"x": np.arange(8)}),
                                               batch_size=4, num_workers=1, process_index=0,
                                               process_count=1)))
            assert any(": 2 loaders with workers are open" in str(w.message)
                       for w in caught) is expected
        del kept
        # (a notebook's interrupted cells: each loader held in a cycle, IPython's of the
        # tracebacks it replaced, until a collection; they were counted, the remedy wrong:
        # the env audit)
        gc.disable()
        try:
            for _ in range(3):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    cycle = [jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                                           num_workers=1, process_index=0, process_count=1)]
                    cycle.append(cycle)
                    iter(cycle[0])
                del cycle
                assert not any("loaders with workers" in str(w.message) for w in caught)
        finally:
            gc.enable()
            gc.collect()  # (the last one)
    finally:
        for loader in made:
            loader.close()


def test_loaders_broken_by_their_workers_error_are_not_counted_as_open(monkeypatch):
    # a loader whose worker raised is held in a cycle (its kept error's traceback) until the
    # collector runs: its workers ended, yet it was counted among the open, and the remedy
    # sent the user after a leak that was not there
    from jaxloader.loaders import open_pools

    def bad(record):
        if int(record["x"]) == 5:
            raise ValueError("bad 5")
        return record

    monkeypatch.setattr(open_pools, "MANY_OPEN", 2)
    gc.disable()  # (the cycles stay, as between the collector's runs)
    try:
        for _ in range(3):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                loader = jl.DataLoader(jl.ArraySource({"x": np.arange(40)}), batch_size=4,
                                       num_workers=1, process_index=0, process_count=1,
                                       transforms=[jl.Map(bad)])
            assert not [w for w in caught if "loaders with workers" in str(w.message)]
            with pytest.raises(jl.WorkerError):
                list(loader)
            del loader
    finally:
        gc.enable()
        gc.collect()


@pytest.mark.e2e
def test_the_notebooks_remedy_lets_go_of_the_loaders_cells_showed_in_a_real_kernel():
    # (the remedy said %reset -f out, after which IPython 8 and 9 keep the last three values
    # shown in their hidden _, __ and ___: their workers stayed until the kernel's restart)
    nbformat = pytest.importorskip("nbformat")
    from nbclient import NotebookClient

    open_now = "gc.collect(); print('open:', len(open_pools._POOLS))"
    cells = ["import gc, numpy as np, jaxloader as jl\nfrom jaxloader.loaders import open_pools"
             "\nsrc = jl.ArraySource({'x': np.arange(40)})"]
    cells += ["jl.DataLoader(src, batch_size=4, num_workers=1, process_index=0, "
              "process_count=1)"] * 4
    cells += [f"Out[2].close()\n{open_now}", "%reset -f out\nget_ipython().user_ns_hidden."
              f"update(_='', __='', ___='')\n{open_now}"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    said = ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells[-2:]]
    assert said[0].endswith("open: 3\n") and said[1].endswith("open: 0\n"), said


@pytest.mark.filterwarnings("ignore:.*fork:RuntimeWarning",  # (JAX's and Python's: the
                            "ignore:.*fork:DeprecationWarning")  # child only counts, and exits)
def test_a_child_forked_while_another_thread_counts_the_pools_counts_its_own():
    # the at-fork hook cleared the pools but kept the lock: held by another thread as the
    # process forked, the child's first loader with workers waited for it for good
    import os
    import signal

    from jaxloader.loaders import open_pools

    class Pool:
        pids = [1]

    open_pools._LOCK.acquire()  # (as another thread holds it, counting)
    try:
        pid = os.fork()
        if pid == 0:  # the child: a loader with workers, counted (never back into pytest)
            try:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (killed if it waits)
                signal.alarm(5)
                pool = Pool()
                open_pools.started("DataLoader 1", pool)
                os._exit(0 if list(open_pools._POOLS) == [pool] else 3)
            finally:
                os._exit(4)
    finally:
        open_pools._LOCK.release()
    assert os.waitpid(pid, 0)[1] == 0  # (not killed by SIGALRM: 14)


@pytest.mark.parametrize("inline", [True, False])
def test_a_close_as_auto_workers_start_says_the_loader_was_closed(monkeypatch, caplog, inline):
    # close() from another thread as a new worker was sent its payload raised a bare
    # BrokenPipeError, and one in a handler run there (a signal's, a log handler's) an
    # IndexError from the status board (the autotune audit)
    import logging
    import threading

    from jaxloader.loaders import monitor

    monkeypatch.setattr(monitor, "WINDOW_S", 1e6)  # (the count changed here, not by timing)
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(400)}), batch_size=4,
                           num_workers="auto", num_epochs=None, process_index=0,
                           process_count=1)
    closer: list = []

    class Closing(logging.Handler):
        def emit(self, record):
            if "started worker process" in record.getMessage() and not closer:
                closer.append(threading.Thread(target=loader.close))
                closer[0].run() if inline else (closer[0].start(), time.sleep(0.3))  # (it
                # waits for the driver this thread holds: joined later)

    handler, logger = Closing(), logging.getLogger("jaxloader")
    logger.addHandler(handler)
    caplog.set_level(logging.INFO, logger="jaxloader")
    try:
        it = iter(loader)
        next(it)
        loader._engine.roster.resize(2)
        with pytest.raises(jl.JaxloaderError, match=r"the loader was closed"):
            for _ in range(50):
                next(it)
    finally:
        logger.removeHandler(handler)
        loader.close()
    if not inline:
        closer[0].join(10)
        assert not closer[0].is_alive()


@pytest.mark.parametrize("last_batch", ["drop", "pad"])
def test_a_batch_transform_is_let_go_with_its_loader_without_workers(last_batch):
    # a BatchMap's watch for draws (and, padded, the note that it keeps the mask) held it, and
    # all its function holds (a table), for the life of the process: in a weak dict whose value
    # held its key, one a loader (a long-lived process making an evaluation's loader each time)
    import weakref

    from jaxloader.batching import batch_finish

    class Table:
        rows = np.ones(4)

    def made(table: Table) -> jl.BatchMap:  # (a cell of its own: a del here would empty it)
        return jl.BatchMap(lambda b: {**b, "x": b["x"] * table.rows[0]})

    table = Table()
    transform = made(table)
    with jl.DataLoader(jl.ArraySource({"x": np.arange(10)}), batch_size=4, last_batch=last_batch,
                       transforms=[transform], process_index=0, process_count=1) as loader:
        assert len(list(loader)) == 2 + (last_batch == "pad")
    noted = [k for k in batch_finish._SAID if k[0] == id(transform)]
    assert len(noted) == (last_batch == "pad")
    held = weakref.ref(table)
    del transform, table, loader
    gc.collect()
    gc.collect()  # (the watch, let go by the first, is a cycle of its own: its calls hold it)
    assert held() is None
    assert not [k for k in noted if k in batch_finish._SAID]
