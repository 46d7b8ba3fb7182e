"""Starting a worker: its environment keeps JAX off the training process's accelerators."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.batching.jit_cpu import CARRIED
from jaxloader.workers.process import (NON_TEMPORAL, NON_TEMPORAL_BYTES, THREAD_DEFAULTS,
                                       worker_environment)

pytestmark = pytest.mark.timeout(120)
HERE = os.path.dirname(os.path.abspath(__file__))


def on_jax(record):
    """A transform a user might write: JAX in the worker, and the backend it ran on."""
    import jax
    import jax.numpy as jnp

    return {"x": np.asarray(jnp.asarray(record["x"]) * 2), "backend": jax.default_backend()}


def test_worker_environment_runs_jax_on_the_cpu_and_keeps_the_rest():
    parent = {"JAX_PLATFORMS": "cuda", "JAX_PLATFORM_NAME": "gpu", "XLA_FLAGS": "--x", "A": "1"}
    made = worker_environment(parent)
    made.pop("GLIBC_TUNABLES", None)  # (x86-64 Linux: the test below)
    for name in CARRIED:  # (this process's JAX settings, where it imported JAX: a test below)
        made.pop(name.upper(), None)
    assert made == {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--x", "A": "1", **THREAD_DEFAULTS}
    assert worker_environment({})["JAX_PLATFORMS"] == "cpu"
    assert parent["JAX_PLATFORMS"] == "cuda"  # the caller's mapping is not changed


def test_math_libraries_run_one_thread_in_a_worker_unless_the_environment_says_otherwise():
    assert worker_environment({})["OPENBLAS_NUM_THREADS"] == "1"
    chosen = worker_environment({"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "2"})
    assert (chosen["OMP_NUM_THREADS"], chosen["MKL_NUM_THREADS"],
            chosen["OPENBLAS_NUM_THREADS"]) == ("4", "2", "1")
    # numba's prange, tokenizers' rayon and OpenCV's pools took a thread a core in each worker
    assert [worker_environment({"RAYON_NUM_THREADS": "3"})[name] for name in (
        "NUMBA_NUM_THREADS", "RAYON_NUM_THREADS", "OPENCV_FOR_THREADS_NUM")] == ["1", "3", "1"]


X86_LINUX = sys.platform == "linux" and os.uname().machine == "x86_64"
LD_SO = "/lib64/ld-linux-x86-64.so.2"  # (glibc's loader: --list-tunables says what it read)


@pytest.mark.skipif(not X86_LINUX, reason="glibc's x86 tunable: x86-64 Linux only")
def test_a_worker_copies_a_megabyte_or_more_past_its_caches_unless_told_otherwise():
    ours = f"{NON_TEMPORAL}={NON_TEMPORAL_BYTES}"
    assert worker_environment({})["GLIBC_TUNABLES"] == ours
    # the training process's other tunables are kept, with the threshold added
    mixed = worker_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert mixed["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{ours}"
    # one it names is its own
    chosen = {"GLIBC_TUNABLES": f"{NON_TEMPORAL}=0x7200000"}
    assert worker_environment(chosen)["GLIBC_TUNABLES"] == chosen["GLIBC_TUNABLES"]
    # glibc reads the value, as a worker's loader does at its start (a loader that lists
    # its tunables: glibc 2.33 or newer)
    listed = subprocess.run([LD_SO, "--list-tunables"], env=mixed, capture_output=True,
                            text=True, timeout=30) if os.path.exists(LD_SO) else None
    if listed is not None and listed.returncode == 0 and "glibc." in listed.stdout:
        assert f"{NON_TEMPORAL}: {NON_TEMPORAL_BYTES:#x} " in listed.stdout
        assert "glibc.malloc.arena_max: 0x2 " in listed.stdout


def test_elsewhere_than_x86_64_linux_the_environment_has_no_tunable(monkeypatch):
    from jaxloader.workers import process

    monkeypatch.setattr(process, "_X86_LINUX", False)
    assert "GLIBC_TUNABLES" not in worker_environment({})
    mixed = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert worker_environment(mixed)["GLIBC_TUNABLES"] == mixed["GLIBC_TUNABLES"]


def worker_tunables(record):
    return {"tunables": np.array(os.environ.get("GLIBC_TUNABLES", ""))}


@pytest.mark.skipif(not X86_LINUX, reason="glibc's x86 tunable: x86-64 Linux only")
def test_a_started_worker_runs_with_the_threshold(monkeypatch):
    # an exec'd worker (or one forked from the starter, exec'd with the worker's environment)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    source = jl.ArraySource({"x": np.arange(2)})
    with jl.DataLoader(source, batch_size=2, transforms=[jl.Map(worker_tunables)],
                       num_workers=1, process_index=0, process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["tunables"].tolist() == [f"{NON_TEMPORAL}={NON_TEMPORAL_BYTES}"] * 2


def process_threads(record):
    """A transform reporting its worker's threads, after a matrix product (a worker forked
    from the starter starts OpenBLAS's threads at its first), and OpenBLAS's setting there."""
    square = np.ones((256, 256))
    square @ square
    return {"threads": np.int64(len(os.listdir("/proc/self/task"))),
            "blas": np.int64(int(os.environ.get("OPENBLAS_NUM_THREADS", "0")))}


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_a_worker_starts_no_thread_a_core_for_numpy_unless_told_to(monkeypatch):
    # NumPy's OpenBLAS starts a thread a core (up to the count it is given) with NumPy
    def worker_threads():
        source = jl.ArraySource({"x": np.arange(4, dtype=np.float32)})
        with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(process_threads)],
                           num_workers=1, process_index=0, process_count=1) as loader:
            batch = next(iter(loader))
        return int(batch["threads"][0]), int(batch["blas"][0])

    def bare_threads(blas: str) -> int:  # a process that imports NumPy, nothing else
        env = {k: v for k, v in os.environ.items() if k not in THREAD_DEFAULTS}
        out = subprocess.run(
            [sys.executable, "-c", "import os, numpy; print(len(os.listdir('/proc/self/task')))"],
            capture_output=True, text=True, timeout=60, env={**env, "OPENBLAS_NUM_THREADS": blas})
        return int(out.stdout)

    # what OpenBLAS adds for 2 threads on this machine (1 with 2 cores or more; 0 where NumPy
    # has another BLAS, or one core)
    added = bare_threads("2") - bare_threads("1")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    alone, setting = worker_threads()
    assert setting == 1
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # the training process's choice
    pooled, setting = worker_threads()
    assert setting == 2
    assert pooled - alone == added


def test_jax_in_a_transform_runs_on_the_cpu_whatever_the_training_process_asks(monkeypatch):
    # a GPU training process's environment: its workers inherited it, and their JAX tried the
    # GPU (here, with no GPU, it failed; on one, each worker took 75% of its memory)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    monkeypatch.setenv("JAX_PLATFORM_NAME", "gpu")
    source = jl.ArraySource({"x": np.arange(8, dtype=np.float32)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(on_jax)], num_workers=2,
                       process_index=0, process_count=1) as loader:
        batches = list(loader)
    assert [b["backend"].tolist() for b in batches] == [["cpu"] * 4] * 2
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches]),
                                  np.arange(8) * 2)


def test_worker_init_fn_may_choose_the_workers_jax_platform():
    def choose(worker_id):
        import jax

        jax.config.update("jax_platforms", "no_such_platform")

    source = jl.ArraySource({"x": np.arange(8, dtype=np.float32)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(on_jax)], num_workers=1,
                       worker_init_fn=choose, process_index=0, process_count=1) as loader:
        with pytest.raises(jl.WorkerError, match="no_such_platform"):
            next(iter(loader))


def test_a_forked_worker_runs_jax_on_the_cpu_too(tmp_path):
    script = tmp_path / "fork.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        import numpy as np, jaxloader as jl

        def on_jax(record):
            import jax
            return {"backend": jax.default_backend()}

        assert "jax" not in sys.modules  # fork is refused once JAX is imported
        os.environ["JAX_PLATFORMS"] = "cuda"
        source = jl.ArraySource({"x": np.arange(4, dtype=np.float32)})
        with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(on_jax)], num_workers=1,
                           start_method="fork", process_index=0, process_count=1) as loader:
            print(next(iter(loader))["backend"].tolist(), os.environ["JAX_PLATFORMS"])
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=100, env={**os.environ, "JAX_PLATFORM_NAME": "gpu"})
    # the worker ran on the CPU; the main process's own environment is as it set it
    assert out.stdout.split("] ") == ["['cpu', 'cpu', 'cpu', 'cpu'", "cuda\n"], out.stderr


def test_forked_workers_started_again_after_an_interrupt_once_jax_is_imported(tmp_path):
    # a Ctrl-C outside the wait restarts the workers; with JAX imported since, the fork was
    # refused, and the loader raised "start_method='fork': JAX is imported" at every call after
    script = tmp_path / "fork_again.py"
    script.write_text(textwrap.dedent("""
        import logging, os, sys
        import numpy as np, jaxloader as jl

        assert "jax" not in sys.modules
        logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
        source = jl.ArraySource({"x": np.arange(16)})
        with jl.DataLoader(source, batch_size=4, num_workers=2, start_method="fork",
                           process_index=0, process_count=1) as loader:
            it = iter(loader)
            print(next(it)["x"].tolist())
            import jax  # (the training loop's first step)
            it._interrupted = loader._engine._mixed_up = True  # (what a Ctrl-C there leaves)
            before = loader.worker_pids
            print(next(it)["x"].tolist(), next(it)["x"].tolist())
            print(loader.worker_pids != before, loader._engine.restarts)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=100)
    lines = out.stdout.splitlines()
    assert lines[0] == "[0, 1, 2, 3]" and lines[-2:] == ["[4, 5, 6, 7] [8, 9, 10, 11]",
                                                         "True 1"], out.stdout + out.stderr
    assert any("fresh interpreters (start_method='exec')" in line for line in lines), out.stdout


def test_a_process_that_reaps_its_children_itself_has_its_workers_ends_said(tmp_path):
    # SIGCHLD ignored (or a handler's waitpid): a forked worker's waitpid raised
    # ChildProcessError from iter() and from every close(), its sibling left running and 10
    # descriptors a loader; a killed starter was said to have ended with "exit code 0"
    script = tmp_path / "reaping.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        import numpy as np
        import jaxloader as jl
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)

        def running(pid):  # (a zombie left to a pid 1 that reaps late has ended)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except FileNotFoundError:
                return False

        def dies(r):
            if r["x"] == 37:
                os._exit(3)
            return r

        for method in ("fork", "exec"):
            # (exec's epoch long enough that its workers end before they have made every batch)
            loader = jl.DataLoader(jl.ArraySource({"x": np.arange(64 if method == "fork"
                                                                  else 1 << 20)}),
                                   batch_size=8, num_workers=2, start_method=method,
                                   transforms=[jl.Map(dies)] if method == "fork" else [])
            pids = loader.worker_pids
            try:
                for step, batch in enumerate(loader):
                    if method == "exec" and step == 0:  # (the starter killed, once: its
                        with open(f"/proc/{pids[0]}/stat") as f:  # workers end with it)
                            os.kill(int(f.read().rsplit(")", 1)[1].split()[1]), signal.SIGKILL)
            except jl.WorkerError as e:
                print(method, str(e).split(": ", 1)[1].split(";")[0])
            loader.close()
            for _ in range(100):  # (a starter's workers end as they see it gone)
                if not any(running(pid) for pid in pids):
                    break
                time.sleep(0.1)
            gone = not any(running(pid) for pid in pids)
            print(method, "closed", gone, flush=True)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("fork its exit code unknown (this process's children are "
                               "reaped by another: SIGCHLD ignored"), lines
    assert lines[1] == "fork closed True", lines
    assert "ended first, its exit code unknown" in lines[2], lines
    assert lines[3] == "exec closed True", lines


def test_a_worker_killed_under_sigpipe_at_its_default_is_said_not_fatal(tmp_path):
    # a script that sets SIGPIPE back to its default (for `| head`): the next task written to
    # a killed worker's pipe raised the kernel's SIGPIPE, which ended the training process at
    # once with status 141 and no word, where a WorkerError names the worker
    script = tmp_path / "piped.py"
    script.write_text(textwrap.dedent("""
        import os, signal
        import numpy as np
        import jaxloader as jl
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        for k in range(2):
            try:
                with jl.DataLoader(jl.ArraySource({"x": np.arange(4096)}), batch_size=2,
                                   num_workers=2) as loader:
                    batches = iter(loader)
                    next(batches)
                    os.kill(loader.worker_pids[k], signal.SIGKILL)
                    for _ in batches:
                        pass
            except jl.WorkerError as e:
                print(str(e).split(":")[0])
        print("went on")
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=100)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert [line.split(" (pid")[0] for line in lines] == ["worker 0", "worker 1", "went on"]


# -- a worker ends with the training process, whatever it is doing ---------------------------
def _gone(pid):
    """Whether ``pid`` has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


@pytest.mark.parametrize("kind", ["map", "stream"])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_workers_inside_user_code_end_with_a_killed_training_process(tmp_path, kind, how):
    trainer = subprocess.Popen([sys.executable, os.path.join(HERE, "orphan_run.py"), kind,
                                str(tmp_path)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        pids = json.loads(trainer.stdout.readline())  # both workers are inside user code
        assert len(pids) == 2 and not any(_gone(pid) for pid in pids)
        pids += [_parent(pid) for pid in pids if _parent(pid) != trainer.pid]  # (the starter)
        trainer.send_signal(how)
        trainer.wait(timeout=10)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not all(_gone(pid) for pid in pids):
            time.sleep(0.05)
        assert all(_gone(pid) for pid in pids), [p for p in pids if not _gone(p)]
    finally:
        trainer.kill()
        trainer.wait()


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="Linux's /dev/shm")
def test_a_killed_training_process_without_memory_files_leaves_no_file_behind(tmp_path):
    # without memory files (no /proc: a sandbox) each worker's stack file and request pipe
    # were temporary files, which a SIGKILL left in $TMPDIR for good (the containers audit);
    # in /dev/shm, Python's resource tracker unlinks them as it does the batch slots
    temp = tmp_path / "tmp"
    temp.mkdir()
    trainer = subprocess.Popen([sys.executable, os.path.join(HERE, "orphan_run.py"), "map",
                                str(tmp_path), "posix"], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.getcwd(), "TMPDIR": str(temp)})
    try:
        assert len(json.loads(trainer.stdout.readline())) == 2  # (the workers run)
        mine = f"_{trainer.pid}_"
        made = [n for n in os.listdir("/dev/shm") if mine in n]
        assert {n.split(mine)[0] for n in made} >= {"jaxloader_stack", "jaxloader_ask",
                                                     "jaxloader"}, made  # (the slots)
        trainer.kill()
        trainer.wait(timeout=10)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(mine in n for n in os.listdir("/dev/shm")):
            time.sleep(0.05)
        assert [n for n in os.listdir("/dev/shm") if mine in n] == []
        assert os.listdir(temp) == []
    finally:
        trainer.kill()
        trainer.wait()


def test_a_worker_whose_parent_died_before_it_asked_to_die_with_it_exits_at_once():
    # its parent is not the pid it was told: the parent died, and this process was reparented
    not_its_parent = os.getpid() + 1  # its parent is this process
    run = subprocess.run([sys.executable, "-c", "from jaxloader.workers.ties import "
                          f"die_with_parent; die_with_parent({not_its_parent}); "
                          "print('still here')"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert (run.returncode, run.stdout, run.stderr) == (1, "", "")


@pytest.mark.skipif(not os.path.exists("/proc/self/oom_score_adj"), reason="Linux's /proc")
def test_workers_are_ended_before_the_trainer_where_memory_runs_out():
    """A container's memory limit fails no allocation: the kernel's out-of-memory killer ends
    the largest process, the training process, without a word, where a worker's transform
    took the memory (the workers audit). A worker's oom_score_adj is the trainer's + 1,000."""
    def adj(pid):
        with open(f"/proc/{pid}/oom_score_adj") as f:
            return int(f.read())

    with jl.DataLoader(jl.ArraySource({"x": np.arange(40)}), batch_size=4,
                       num_workers=2) as loader:
        next(iter(loader))  # (worker 0's batch: worker 1 may be starting still)
        deadline = time.monotonic() + 10
        while [adj(pid) for pid in loader.worker_pids] != [min(1000, adj("self") + 1000)] * 2:
            assert time.monotonic() < deadline, [adj(pid) for pid in loader.worker_pids]
            time.sleep(0.01)


def test_workers_started_from_a_thread_that_ends_outlive_that_thread():
    # the kernel's parent-death signal follows the thread that started a process: workers
    # started from a short-lived thread (a notebook's, a device-put thread's) must not die
    # with it
    made = []

    def start():
        loader = jl.DataLoader(jl.ArraySource({"x": np.arange(40)}), batch_size=4,
                               num_workers=2, process_index=0, process_count=1)
        made.append((loader, [next(iter(loader))["x"]]))  # the workers run (and asked)

    maker = threading.Thread(target=start)
    maker.start()
    maker.join()
    loader, got = made[0]
    time.sleep(0.3)  # (a worker killed with the thread is gone by now)
    with loader:
        got += [b["x"] for b in loader]
    assert sorted(np.concatenate(got).tolist()) == list(range(40))


def test_a_full_descriptor_table_as_workers_start_names_the_limit(monkeypatch):
    # os.pipe2 (a worker's request pipe) raised a bare OSError: [Errno 24] Too many open files
    import errno

    from jaxloader.workers import stacks

    def full(*args):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(stacks.os, "pipe2", full)
    with pytest.raises(jl.SharedMemoryError, match=r"no descriptor left for the 2 workers' pipes "
                                                   r"and status files \(Too many open files; "
                                                   r"this process may hold [\d,]+.*raise the "
                                                   r"limit .*use fewer workers"):
        jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, num_workers=2,
                      process_index=0, process_count=1)


def test_a_worker_lets_its_other_slots_go_where_a_mapping_finds_no_room(monkeypatch):
    # an address space limit (ulimit -v) filled by the slots a worker kept mapped for later: a
    # bare "OSError: [Errno 12] Cannot allocate memory" where one slot at a time fit
    import errno
    import mmap

    from jaxloader.workers import worker

    def attach(name, size):  # room for one mapping
        if slots._maps:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return mmap.mmap(-1, size)

    monkeypatch.setattr(worker.shm, "attach", attach)
    slots = worker._Slots()
    slots.get("a", 4096).release()
    assert len(slots.get("b", 4096)) == 4096 and list(slots._maps) == ["b"]
    monkeypatch.setattr(worker.shm, "attach", lambda name, size: attach(name, size)
                        if name != "c" else (_ for _ in ()).throw(
                            OSError(errno.ENOMEM, "Cannot allocate memory")))
    with pytest.raises(jl.SharedMemoryError, match=r"could not map 4,096 bytes \(Cannot allocate"
                                                   r" memory\): this process's address space is"):
        slots.get("c", 4096)


def test_a_worker_lets_go_of_slots_it_has_not_been_given_for_a_while(monkeypatch):
    # the ring lets its free slots past the most in use lately go (a kept pass dropped), but a
    # worker kept their mappings, and their memory, up to its 128 (60 MB for 2 workers; the
    # seventeenth review)
    import mmap

    from jaxloader.workers import worker

    monkeypatch.setattr(worker.shm, "attach", lambda name, size: mmap.mmap(-1, size))
    slots = worker._Slots()
    for k in range(40):  # (a pass kept: 40 slots)
        slots.get(f"kept{k}", 4096).release()
    for k in range(600):  # (then two slots in turn, past _UNUSED)
        slots.get(f"now{k % 2}", 4096).release()
    assert sorted(slots._maps) == ["now0", "now1"]


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(jl.__file__)), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=90, cwd=tmp_path, env=env)


def test_a_forked_childs_close_leaves_the_parents_workers_and_batches_alone(tmp_path):
    # the child's close() drained the parent's batches from the pipes it shares (a with block
    # in a fork-started multiprocessing.Process, an async checkpoint writer's exit): the parent
    # waited for good, or past timeout_s in a read (the process-managers audit)
    done = _run("""
        import os, numpy as np, jaxloader as jl
        loader = jl.DataLoader(jl.ArraySource({"x": np.arange(400)}), batch_size=10,
                               num_workers=2, timeout_s=20, process_index=0, process_count=1)
        it = iter(loader)
        first = [next(it)["x"][0] for _ in range(3)]
        child = os.fork()
        if child == 0:
            loader.close()
            os._exit(0)
        os.waitpid(child, 0)
        print([int(b["x"][0]) for b in it][:3])
        loader.close()
    """, tmp_path)
    assert done.stdout.strip() == "[30, 40, 50]", done.stderr[-2000:]


def test_an_unclosed_loaders_workers_are_asked_to_stop_at_exit_and_said_closed_not_killed(
        tmp_path):
    # made after a loader without workers made a batch (weakref.finalize's exit hook then ran
    # after the starters were closed), the workers died by their parent-death signal, their
    # atexit hooks not run; a thread still reading at exit was told a worker was killed,
    # "often the out-of-memory killer"; a forked child's exit with start_method='fork' printed
    # a ChildProcessError (the process-managers audit). A worker of start_method='fork' ended
    # without its atexit hooks, where workers.md says they run (the workers audit)
    done = _run("""
        import os, threading, numpy as np, jaxloader as jl
        def init(worker, named="ended"):
            import atexit
            atexit.register(lambda: open(f"{named}-{worker}", "w").close())
        src = jl.ArraySource({"x": np.arange(4000)})
        next(iter(jl.DataLoader(src, batch_size=10, num_workers=0)))
        loader = jl.DataLoader(src, batch_size=10, num_workers=2, worker_init_fn=init)
        for _, b in zip(range(5), loader):
            pass
        threading.Thread(target=lambda: [b for b in loader], daemon=True).start()
        forked = jl.DataLoader(src, batch_size=10, num_workers=1, start_method="fork",
                               worker_init_fn=lambda worker: init(worker, "forked"))
        next(iter(forked))
        if os.fork() == 0:
            raise SystemExit(0)
        os.wait()
    """, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["ended-0", "ended-1", "forked-0"], \
        done.stderr[-2000:]
    assert "out-of-memory" not in done.stderr and "ChildProcessError" not in done.stderr, \
        done.stderr[-3000:]


def test_a_program_a_transform_ran_ends_when_its_worker_dies(tmp_path):
    # a worker killed (the OOM killer) left the program its transform had started running
    # until the training process ended: close() skips a worker whose end is known, its pid
    # maybe another's now (the workers audit)
    done = _run("""
        import os, signal, subprocess, time, numpy as np, jaxloader as jl

        class Source:
            def __len__(self):
                return 64
            def __getitem__(self, i):
                if i == 20:
                    program = subprocess.Popen(["sleep", "300"])
                    with open("program.pid", "w") as f:
                        f.write(str(program.pid))
                    os.kill(os.getpid(), signal.SIGKILL)
                return {"x": np.full(4, i)}

        loader = jl.DataLoader(Source(), batch_size=4, num_workers=2, process_index=0,
                               process_count=1)
        try:
            list(loader)
        except jl.WorkerError as e:
            print("died" if "killed by signal 9" in str(e) else e)
        pid = int(open("program.pid").read())
        def running():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
            except OSError:
                return False
        deadline = time.monotonic() + 10
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
        print("program ended before close:", not running())
        loader.close()
        if running():
            os.kill(pid, signal.SIGKILL)
    """, tmp_path)
    assert done.stdout.splitlines()[:2] == ["died", "program ended before close: True"], (
        done.stdout, done.stderr[-2000:])


_PROGRAMS = """
    import os, subprocess, sys, time, numpy as np, jaxloader as jl

    def keep_a_program(record):  # (a tokenizer server, a decoder pipe: started once, kept)
        global program
        if "program" not in globals():
            program = subprocess.Popen(["sleep", "300"])
            with open(f"program.{os.getpid()}", "w") as f:
                f.write(str(program.pid))
        return record

    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=4, num_workers=2,
                           transforms=[jl.Map(keep_a_program)], process_index=0, process_count=1)
    batches = iter(loader)
    for _ in range(8):
        next(batches)
    while len([n for n in os.listdir() if n.startswith("program.")]) < 2:
        time.sleep(0.05)
    if sys.argv[1] == "close":
        loader.close()
        print("closed", flush=True)
    else:
        print("ready", flush=True)
        time.sleep(300)
"""


@pytest.mark.parametrize("end", ["close", "SIGKILL"])
def test_the_programs_a_transform_keeps_end_with_its_loader(tmp_path, end):
    # a program a transform started and kept ran on for good: past close() (an idle worker
    # stopped as asked: its group was killed only where it had died unasked), and past the
    # training process killed (its workers killed by the kernel with it, their groups not)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.dirname(os.path.dirname(jl.__file__)), os.environ.get("PYTHONPATH", "")])}
    trainer = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_PROGRAMS), end],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    programs = []
    try:
        assert trainer.stdout.readline().strip() == ("closed" if end == "close" else "ready")
        programs = [int(p.read_text()) for p in tmp_path.glob("program.*")]
        if end == "SIGKILL":
            trainer.kill()
        deadline = time.monotonic() + 10
        while any(_running(p) for p in programs) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_running(p) for p in programs)
    finally:
        trainer.kill()
        trainer.wait()
        for pid in programs:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_ctrl_c_as_a_started_workers_pipe_closes_leaves_it_in_the_callers_list(monkeypatch):
    # (the lifecycle audit) a Ctrl-C in the close of the child's end of the pipe, after the
    # worker started, came before it joined the caller's list: its pid was lost (forked: a
    # zombie for good, 3 to 7 in 80 interrupted starts)
    from multiprocessing.connection import Connection

    from jaxloader.workers.endings import stop_all
    from jaxloader.workers.process import WorkerProcess

    real, fired, into = Connection.close, [], []

    def close(self):
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Connection, "close", close)
    with pytest.raises(KeyboardInterrupt):
        WorkerProcess("exec", into)
    monkeypatch.undo()
    try:
        assert fired and len(into) == 1 and into[0].pid > 0
    finally:
        stop_all(into)
