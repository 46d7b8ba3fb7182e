"""Shared fixtures: every test must leave no jaxloader segment in /dev/shm and no live child."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
import threading
import time

import pytest


def live_children() -> list[tuple[int, str]]:
    """Live (not zombie) child processes of this process, except Python's resource tracker;
    and in place of the worker starter it keeps (``jaxloader.workers.starter``, which lives
    as long as the process), the workers it started."""
    me, found = os.getpid(), []
    processes = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        processes.append((int(entry), int(ppid), state, cmdline))
    starters = {pid for pid, ppid, _, cmdline in processes
                if ppid == me and "jaxloader.workers.starter" in cmdline}
    for pid, ppid, state, cmdline in processes:
        if (ppid == me or ppid in starters) and pid not in starters and state != "Z" \
                and "resource_tracker" not in cmdline:
            found.append((pid, cmdline))
    return found


def _segments() -> set[str]:
    """jaxloader's POSIX segments in /dev/shm, and the memory files this process holds open."""
    try:
        # this process's (its pid in the name: test processes may run side by side)
        found = {n for n in os.listdir("/dev/shm") if n.startswith(f"jaxloader_{os.getpid()}_")}
    except FileNotFoundError:
        found = set()
    for fd in os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else ():
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("/memfd:jaxloader"):
            found.add(f"{link} (fd {fd})")
    return found


with open(os.path.join(os.path.dirname(__file__), "slow_tests.txt")) as _listed:
    # a test's id, then, for the longest, its longest parameter's seconds
    _SLOW = {fields[0]: float(fields[1]) if len(fields) > 1 else 2.0
             for fields in (line.split() for line in _listed if not line.startswith("#"))
             if fields}


_TESTS = os.path.dirname(os.path.abspath(__file__))


def pytest_configure(config):
    """Compiles the package's and the tests' bytecode once, before any test (in the controller
    of ``-n 2``). Each worker process is a fresh interpreter that imports the package, and
    where ``PYTHONDONTWRITEBYTECODE`` is set (this machine, many containers) and the install
    is editable, nothing else writes it: every worker start compiled the whole package again
    (~0.2 s, two fifths of a worker's start). Python checks each file's time against its
    source, so an edited module is compiled anew; the files go to ``__pycache__``
    (``.gitignore``)."""
    _temporary_files_in_a_folder_of_this_run()
    if hasattr(config, "workerinput"):  # (an xdist process: its controller did it)
        return
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("jaxloader")
    package = list(spec.submodule_search_locations or []) if spec else []
    for folder in [*package, _TESTS]:
        compileall.compile_dir(folder, quiet=1)


_MADE_HERE: list[str] = []  # this process's folder of temporary files, removed as it ends


def _temporary_files_in_a_folder_of_this_run() -> None:
    """The docstrings' examples and some tests make files with ``tempfile.mkdtemp()`` as a
    user would; left in ``/tmp``, each run of the suite added ~20 folders for good. The run
    makes them in a folder of its own (``TMPDIR``: its ``-n 2`` workers and children too),
    removed as the controller ends (``pytest_unconfigure``). One folder, short: Ray's socket
    paths under it must fit in AF_UNIX's 107 bytes (a worker's folder in the controller's
    did not)."""
    import tempfile

    run = os.environ.get("JAXLOADER_TESTS_TMPDIR")
    if run and run == os.environ.get("TMPDIR") and os.path.isdir(run):
        tempfile.tempdir = os.environ["TMPDIR"]  # (a worker of the run: the run's folder)
        return
    # pytest's own tmp_path folders stay where they were (kept for the last three runs)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    folder = tempfile.mkdtemp(prefix="jl-tests-")
    _MADE_HERE.append(folder)
    tempfile.tempdir = os.environ["TMPDIR"] = os.environ["JAXLOADER_TESTS_TMPDIR"] = folder


def pytest_unconfigure(config):
    import shutil

    for folder in _MADE_HERE:
        shutil.rmtree(folder, ignore_errors=True)


_BY_VALUE: set[str] = set()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The test modules' functions cross to the workers by value (``cloudpickle``), as a
    script's or a notebook's do, instead of by name. A worker otherwise imports the test
    module a transform was defined in, and with it pytest and whatever else the module
    imports: ~0.5 s more a worker start (a third of a stream resume test's time). Helper modules
    (``resume_harness``, ``fake_gcs``: their state lives in the worker's copy) still cross by
    name, and so does a test module that sets ``WORKERS_IMPORT_THIS_MODULE``, whose top level
    must run in the workers (a pytree registration). A user's module imported by name has a
    test of its own (``tests/workers/test_payload.py``)."""
    import cloudpickle

    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if (name not in _BY_VALUE and path.startswith(_TESTS + os.sep)
                and os.path.basename(path).startswith("test_")
                and not getattr(module, "WORKERS_IMPORT_THIS_MODULE", False)):
            _BY_VALUE.add(name)
            cloudpickle.register_pickle_by_value(module)


def pytest_collection_modifyitems(config, items):
    """Marks ``slow`` the tests listed in slow_tests.txt and the end-to-end ones (the fast
    check is ``-m "not slow"``). ``JAXLOADER_E2E=0`` skips the end-to-end tests (marked
    ``e2e``): CI runs them on its newest Python only, and the rest on both (``.ci/run``)."""
    slow = pytest.mark.slow
    for item in items:
        if "e2e" in item.keywords or item.nodeid.split("[")[0] in _SLOW:
            item.add_marker(slow)
    # The slow ones first, the longest first (slow_tests.txt): xdist's worksteal gives the
    # first half of the list to one test process (-n 2), which starts on the longest, and the
    # other steals from the end of its queue once its own half is done; the two then end on
    # short tests together, not one on a minute-long test while the other idles
    items.sort(key=lambda item: -_SLOW.get(item.nodeid.split("[")[0],
                                            2.0 if "slow" in item.keywords else 0.0))
    if os.environ.get("JAXLOADER_E2E", "1") != "0":
        return
    skip = pytest.mark.skip(reason="end to end: run on CI's newest Python (JAXLOADER_E2E=0)")
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


# Scripts the tests start in processes of their own: never imported by the doctest collector.
collect_ignore_glob = ["*_run.py"]

_EXIT_GRACE_S = 3.0  # a child told to stop (a worker, a notebook kernel) may still be exiting


@pytest.fixture(autouse=True)
def no_leaks():
    before = _segments()
    running = {pid for pid, _ in live_children()}  # (a module's fixture's: a Ray cluster)
    threads = set(threading.enumerate())  # (one an earlier test left is not this one's)
    yield
    deadline = time.monotonic() + _EXIT_GRACE_S
    while True:
        children = [p for p in multiprocessing.active_children() if p.is_alive()]
        children += [child for child in live_children() if child[0] not in running]
        if not children or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not children, f"live child processes left behind: {children}"
    # A device-put thread that outlived close()'s short wait ends by itself once its workers
    # are gone, and lets its slots go then: waited for (as long as the children), not counted.
    for thread in set(threading.enumerate()) - threads:  # (one blocked for good in a source
        if thread.name == "jaxloader-host-prefetch":  # made each later test wait 3 s)
            thread.join(max(0.0, deadline - time.monotonic()))
    leaked = _segments() - before
    if leaked:  # a mapping holds its memory file open until the last view of it is garbage
        gc.collect()  # (only then: a full collection takes 0.1-0.2 s in a test process)
        leaked = _segments() - before
    assert not leaked, f"shared memory left behind (/dev/shm, memory files): {sorted(leaked)}"
    held = _locks_held()
    assert not held, f"module locks left held by this test (a later one waits for them): {held}"


# jaxloader's module-level locks: one a test left held (an interrupt raised where no real one
# lands) made a later test, in the same process, wait for ever for it in another thread
_MODULE_LOCKS = [("jaxloader.workers.ring", "_LOCK"), ("jaxloader.loaders.open_pools", "_LOCK"),
                 ("jaxloader.workers.starter", "_LOCK"), ("jaxloader.workers.endings", "_ENDS_LOCK"),
                 ("jaxloader.sources.block_tables", "_LOCK"),
                 ("jaxloader.workers.spawner", "_SPAWNER_LOCK")]


def _locks_held() -> list[str]:
    held = []
    for module, name in _MODULE_LOCKS:
        lock = getattr(sys.modules.get(module), name, None)
        if lock is None:  # (not imported by this process yet)
            continue
        owned = getattr(lock, "_is_owned", None)  # (an RLock: held by this thread)
        if (owned is not None and owned()) or not lock.acquire(timeout=1.0):  # (another's:
            held.append(f"{module}.{name}")  # a thread of the test's may be in it a moment)
        else:
            lock.release()
    return held


@pytest.fixture
def gcs(tmp_path):
    """``gs://`` served from ``tmp_path`` (``fake_gcs``): yields the folder and the
    ``worker_init_fn`` that serves it in workers too."""
    import functools

    import fake_gcs

    fake_gcs.register(str(tmp_path))
    try:
        yield tmp_path, functools.partial(fake_gcs.register, str(tmp_path))
    finally:
        fake_gcs.unregister()
