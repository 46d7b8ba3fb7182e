"""Workers in the environments a training process runs in: its standard descriptors closed,
interpreter flags, a scheduler's SIGTERM to the process group, SIGCHLD ignored, a directory
gone, warnings shown (each in a fresh process: what it changes is the process's own)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.workers import starter

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not starter.AVAILABLE, reason="the starter is Linux's")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PRELUDE = f"""
import os, signal, sys, tempfile, time
sys.path.insert(0, {ROOT!r})
import numpy as np
import jaxloader as jl

def loader(transforms=(), num_workers=2, **kw):
    return jl.DataLoader(jl.ArraySource({{"y": np.arange(40)}}), batch_size=4,
                         num_workers=num_workers, transforms=list(transforms), process_index=0,
                         process_count=1, **kw)
"""


def run(tmp_path, body, *flags, shell="", prefix="", wrapper="", **kw):
    """``body`` after ``PRELUDE`` as a script of its own (``shell``: how a shell redirects
    it; ``prefix``: shell commands before; ``wrapper``: a command it runs under); its output
    (stdout, stderr) and exit code."""
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    command = " ".join([sys.executable, *flags, str(script)])
    done = subprocess.run(["sh", "-c", f"{prefix} exec {wrapper} {command} {shell}"],
                          capture_output=True, text=True, timeout=100, cwd=tmp_path, **kw)
    return done.stdout, done.stderr, done.returncode


def test_workers_start_with_the_standard_output_or_error_closed(tmp_path):
    # the loader's own descriptors took numbers 1 and 2 and went to workers as their standard
    # output, which overwrote a worker's pipe: it never started (a bare BrokenPipeError)
    for closed in (">&-", "2>&-", "<&- >&- 2>&-"):
        out, err, code = run(tmp_path, """
            with loader() as ld:
                got = [b["y"].tolist() for b in ld]
            open("got.txt", "w").write(repr(got[:2]))
            """, shell=closed)
        assert code == 0, (closed, err)
        assert (tmp_path / "got.txt").read_text() == "[[0, 1, 2, 3], [4, 5, 6, 7]]"


def test_workers_run_under_the_interpreters_flags(tmp_path):
    # python -O: with workers, a transform's assert still ran (the workers' interpreter had
    # none of the trainer's flags), and 0 and 2 workers gave other results
    (tmp_path / "checks.py").write_text(
        "import sys\n\ndef check(r):\n    assert r['y'] < 5, 'debug only'\n"
        "    return {'y': r['y'], 'optimize': sys.flags.optimize}\n")
    out, err, code = run(tmp_path, """
        import checks
        for workers in (0, 2):
            with loader([jl.Map(checks.check)], num_workers=workers) as ld:
                print(workers, sorted({int(v) for b in ld for v in b["optimize"]}))
        """, "-O", env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert code == 0, err
    assert out.split("\n")[:2] == ["0 [1]", "2 [1]"]


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGUSR2", "SIGHUP"])
def test_a_trainer_that_saves_on_a_schedulers_warning_signal_keeps_its_workers(tmp_path, name):
    # SLURM's --signal=USR1@90 (to every process of the step), submitit's USR2 and HUP: only
    # SIGINT and SIGTERM were left to the trainer, and these killed the workers and their
    # starter before the trainer's save (the preemption audit)
    out, err, code = run(tmp_path, f"""
        told = []
        signal.signal(signal.{name}, lambda *_: told.append(1))

        def descendants(pid):  # (slurmstepd signals each process of the step)
            return [d for t in os.listdir(f"/proc/{{pid}}/task") for c in open(
                f"/proc/{{pid}}/task/{{t}}/children").read().split() for d in [int(c),
                *descendants(int(c))]]
        with loader(num_epochs=None, prefetch=1) as ld:
            it = iter(ld)
            for step in range(1, 200):
                next(it)
                if step == 5:
                    for pid in [os.getpid(), *descendants(os.getpid())]:
                        os.kill(pid, signal.{name})
                    time.sleep(0.5)  # (the workers' end, if they die of it)
                if told and step % 50 == 0:
                    print("saved at step", ld.state_dict()["step"])
                    break
        """, start_new_session=True)
    assert code == 0, err
    assert out.split("\n")[:1] == ["saved at step 50"], (out, err)


def test_a_trainer_that_saves_on_a_group_sigterm_keeps_its_workers(tmp_path):
    # timeout, SLURM's preemption, kill -TERM -PGID: the workers (and their starter) died of
    # it, and a trainer that goes on to its next checkpoint got a WorkerError before saving
    out, err, code = run(tmp_path, """
        told = []
        signal.signal(signal.SIGTERM, lambda *_: told.append(1))
        with loader(num_epochs=None, prefetch=1) as ld:
            it = iter(ld)
            for step in range(1, 200):
                next(it)
                if step == 5:
                    os.killpg(0, signal.SIGTERM)
                    time.sleep(0.5)  # (the workers' end, if they die of it)
                if told and step % 50 == 0:
                    print("saved at step", ld.state_dict()["step"])
                    break
        import subprocess
        def child(r):  # (a program a transform runs still ends on terminate())
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
            time.sleep(0.2)
            p.terminate()
            try:
                return {"code": np.int64(p.wait(timeout=10))}
            except subprocess.TimeoutExpired:
                p.kill()
                return {"code": np.int64(0)}
        with jl.DataLoader(jl.ArraySource({"y": np.arange(1)}), batch_size=1, num_workers=1,
                           transforms=[jl.Map(child)], process_index=0, process_count=1) as ld:
            print("child", next(iter(ld))["code"][0])
        """, start_new_session=True)
    assert code == 0, err
    assert out.split("\n")[:2] == ["saved at step 50", "child -15"], (out, err)


def test_a_program_a_transform_runs_does_not_ignore_sigint(tmp_path):
    # workers ignored SIGINT, and every program a transform ran inherited it: a transform's
    # send_signal(SIGINT) to one did nothing there, and did with 0 workers
    out, err, code = run(tmp_path, """
        import subprocess
        probe = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
        def child(r):
            done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
            return {"ignored": np.array(done.stdout.strip() == "True")}
        for workers in (0, 1):
            with loader([jl.Map(child)], num_workers=workers) as ld:
                print(workers, bool(next(iter(ld))["ignored"].any()))
        """)
    assert code == 0, err
    assert out.split("\n")[:2] == ["0 False", "1 False"], (out, err)


def test_a_terminals_ctrl_c_is_the_trainers_and_leaves_the_workers_batches_alone(tmp_path):
    # a Ctrl-C goes to the terminal's whole process group: a program a worker's transform ran
    # would end of it, and a trainer that goes on after its KeyboardInterrupt (here caught in
    # its step, outside next()) would get that read-ahead batch's error
    out, err, code = run(tmp_path, """
        import subprocess, threading
        def slow(r):
            subprocess.run(["sleep", "0.4"], check=True)
            return r
        with loader([jl.Map(slow)], num_workers=2, prefetch=2) as ld:
            it = iter(ld)
            first = next(it)["y"].tolist()
            threading.Timer(0.2, lambda: os.killpg(0, signal.SIGINT)).start()
            try:
                time.sleep(5)  # (the training step)
            except KeyboardInterrupt:
                pass
            print(first, next(it)["y"].tolist(), next(it)["y"].tolist())
        """, start_new_session=True)
    assert code == 0, err
    assert out.split("\n")[0] == "[0, 1, 2, 3] [4, 5, 6, 7] [8, 9, 10, 11]", (out, err)


def test_a_ctrl_c_while_a_fresh_interpreter_for_workers_imports_does_not_reach_it(tmp_path):
    # the starter (and an exec'd worker) joined a process group of its own only once it had
    # imported jaxloader: a notebook's interrupt in that window printed its KeyboardInterrupt
    out, err, code = run(tmp_path, """
        import subprocess
        from jaxloader.workers import launch
        child = launch.launch("import time; time.sleep(1.0); print('imported')",
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (after: an ignored one is inherited)
        time.sleep(0.3)
        os.killpg(0, signal.SIGINT)
        print(child.communicate(), child.returncode)
        """, start_new_session=True)
    assert code == 0, err
    assert out.strip() == "('imported\\n', '') 0", (out, err)


def test_a_fresh_interpreter_for_workers_writing_to_a_tostop_terminal_is_not_stopped(tmp_path):
    # in a group of its own it is a background process: under `stty tostop` a write to the
    # terminal (a warning as it imports) stopped it, and the loader waited on it for good
    script = tmp_path / "tostop.py"
    script.write_text(textwrap.dedent(f"""
        import os, pty, subprocess, sys, termios
        sys.path.insert(0, {ROOT!r})
        pid, fd = pty.fork()
        if pid == 0:
            attrs = termios.tcgetattr(0)
            attrs[3] |= termios.TOSTOP
            termios.tcsetattr(0, termios.TCSANOW, attrs)
            from jaxloader.workers import launch
            child = launch.launch("import sys; sys.stderr.write('a warning\\\\n')")
            try:
                print("exited", child.wait(timeout=10), flush=True)
            except subprocess.TimeoutExpired:
                print("stopped", flush=True)
                child.kill()
            os._exit(0)
        out = b""
        while True:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        os.waitpid(pid, 0)
        print(out.decode(errors="replace"))
        """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert "a warning" in done.stdout and "exited 0" in done.stdout, (done.stdout, done.stderr)


def test_workers_start_where_a_sandbox_forbids_a_process_group_of_their_own(monkeypatch):
    # Popen(process_group=0) raised PermissionError there, and no worker started
    from jaxloader.workers import launch

    plain = subprocess.Popen

    def sandboxed(args, **kw):
        if "process_group" in kw:
            raise PermissionError(1, "Operation not permitted")
        return plain(args, **kw)

    monkeypatch.setattr(launch.subprocess, "Popen", sandboxed)
    child = launch.launch("print('started')", stdout=subprocess.PIPE, text=True)
    assert child.communicate()[0] == "started\n" and child.returncode == 0


def test_a_ctrl_c_in_a_workers_c_call_does_not_fail_it(tmp_path):
    # a worker catches SIGINT to leave it to the trainer: a read in C it lands in is restarted
    # (as under an ignored one), not failed with EINTR for a library that does not retry it
    out, err, code = run(tmp_path, """
        def read_in_c(r):
            import ctypes, threading
            libc = ctypes.CDLL(None, use_errno=True)
            rd, wr = os.pipe()
            me = threading.get_ident()
            def poke():
                time.sleep(0.1)
                signal.pthread_kill(me, signal.SIGINT)
                time.sleep(0.15)
                os.write(wr, b"x")
            threading.Thread(target=poke).start()
            got = libc.read(rd, ctypes.create_string_buffer(1), 1)
            return {"read": np.int64(got), "errno": np.int64(ctypes.get_errno() if got < 0 else 0)}
        with loader([jl.Map(read_in_c)], num_workers=1) as ld:
            batch = next(iter(ld))
            print(batch["read"].tolist(), batch["errno"].tolist())
        """)
    assert code == 0, err
    assert out.split("\n")[0] == "[1, 1, 1, 1] [0, 0, 0, 0]", (out, err)


def test_a_worker_that_exits_is_reported_by_its_code_with_sigchld_ignored(tmp_path):
    # SIG_IGN reached the starter through exec: the kernel reaped its workers, and one that
    # exited with code 3 was reported killed by SIGKILL ("often the out-of-memory killer")
    out, err, code = run(tmp_path, """
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        def die(r):
            if r["y"] == 13:
                os._exit(3)
            return r
        try:
            with loader([jl.Map(die)]) as ld:
                list(ld)
        except jl.WorkerError as e:
            print(str(e).splitlines()[0])
        """)
    assert code == 0, err
    assert "exit code 3" in out, out


def test_workers_start_in_a_directory_that_is_gone_and_leave_no_warning(tmp_path):
    # a directory removed under the trainer: on 3.13.0 the starter could not import NumPy
    # there (a bare ConnectionResetError); and -X dev warned of the starter's process and
    # sockets, never closed nor waited for, at exit
    out, err, code = run(tmp_path, """
        gone = tempfile.mkdtemp()
        os.chdir(gone)
        os.rmdir(gone)
        with loader() as ld:
            print(len(list(ld)))
        """, "-X", "dev")
    assert code == 0, err
    assert out.strip() == "10"
    assert "ResourceWarning" not in err, err


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a PID namespace of its own: root's unshare")
def test_shared_memory_closed_to_a_worker_says_why_and_what_to_do(tmp_path):
    # in a PID namespace without its /proc (or a trainer not dumpable: os.setuid), a worker
    # cannot open the trainer's memory files: a bare "Permission denied: '/proc/1/fd/6'",
    # said to come from the payload or worker_init_fn
    out, err, code = run(tmp_path, """
        try:
            with loader() as ld:
                list(ld)
        except jl.WorkerError as e:
            print(str(e).splitlines()[0])
        """, wrapper="unshare -pf")
    assert "mount its /proc (unshare --fork --pid --mount-proc)" in out, (out, err)


def test_workers_start_where_the_trainers_path_finds_numpy_only(tmp_path):
    # python -S with sys.path made by hand, a relative PYTHONPATH entry: the starter imported
    # NumPy from its own path (and, first, from "/"), could not, and ended with a bare
    # ConnectionResetError
    import numpy

    site = os.path.dirname(os.path.dirname(numpy.__file__))
    out, err, code = run(tmp_path, """
        with loader() as ld:
            print(len(list(ld)))
        """, "-S", prefix=f"cd {os.path.dirname(site)} &&",
        env={**os.environ, "PYTHONPATH": os.path.basename(site)})
    assert code == 0, err
    assert out.strip() == "10"


def test_workers_start_under_a_long_or_odd_sys_path(tmp_path):
    # the path went to the starter in its command line (an argument holds 128 KiB: "Argument
    # list too long"), and an entry that is no path (an int) failed it with a TypeError
    out, err, code = run(tmp_path, """
        sys.path += ["/nowhere/" + "p" * 100 + str(i) for i in range(1400)] + [42]
        with loader() as ld:
            print(len(list(ld)), len(repr(sys.path)) > 1 << 17)
        """)
    assert code == 0, err
    assert out.strip() == "10 True"


def test_a_starter_that_cannot_start_says_so(tmp_path):
    out, err, code = run(tmp_path, """
        from jaxloader.workers import launch
        real = launch.launch
        launch.launch = lambda code, **kw: real("raise SystemExit('a broken environment')", **kw)
        try:
            with loader() as ld:
                list(ld)
        except jl.JaxloaderError as e:
            print(e)
        """)
    assert "a broken environment" in err
    assert out.startswith("the worker starter (pid ") and "ended before it started a worker" \
        " (exit code 1): its own error is above" in out, (out, err)


def test_a_pool_a_transform_forks_ends_and_workers_see_the_trainers_argv(tmp_path):
    # a forked multiprocessing.Pool's children kept the worker's SIGTERM handler, which does
    # nothing: the Pool's end (terminate) waited for them forever; and a module that parses
    # the command line as it is imported read the worker's ["-c"]: its defaults, silently
    (tmp_path / "config.py").write_text(
        "import argparse\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--scale', type=float, default=1.0)\n"
        "args, _ = parser.parse_known_args()\n\n"
        "def scale(r):\n    return {'y': r['y'] * args.scale}\n")
    out, err, code = run(tmp_path, """
        import multiprocessing
        import config
        def pooled(r):
            with multiprocessing.get_context("fork").Pool(2) as pool:
                return {"y": np.int64(sum(pool.map(abs, [int(r["y"]), -int(r["y"])])))}
        with loader([jl.Map(pooled)], num_workers=1, timeout_s=40) as ld:
            print("pooled", next(iter(ld))["y"].tolist())
        def terminated(r):  # (what Pool.terminate asks of each child, which raced its end)
            ready, told = os.pipe()
            child = os.fork()
            if child == 0:
                os.write(told, b"1")
                time.sleep(3)
                os._exit(0)
            os.read(ready, 1)
            os.kill(child, signal.SIGTERM)
            return {"y": np.int64(os.WIFSIGNALED(os.waitpid(child, 0)[1]))}
        with loader([jl.Map(terminated)], num_workers=1) as ld:
            print("terminated", next(iter(ld))["y"].tolist())
        def at_once(r):  # (a SIGTERM sent as the fork returned tripped the worker's handler,
            lived = 0  # which the child's reset then dropped: it lived on; 33 of 40 here)
            for _ in range(10):
                child = os.fork()
                if child == 0:
                    time.sleep(0.2)
                    os._exit(0)
                os.kill(child, signal.SIGTERM)
                lived += not os.WIFSIGNALED(os.waitpid(child, 0)[1])
            return {"y": np.int64(lived)}
        with loader([jl.Map(at_once)], num_workers=1) as ld:
            print("lived", next(iter(ld))["y"].tolist())
        for workers in (0, 2):
            with loader([jl.Map(config.scale)], num_workers=workers) as ld:
                print(workers, next(iter(ld))["y"].tolist())
        """, env={**os.environ, "PYTHONPATH": str(tmp_path)}, shell="--scale 10")
    assert code == 0, err
    assert out.split("\n")[:5] == ["pooled [0, 2, 4, 6]", "terminated [1, 1, 1, 1]",
                                   "lived [0, 0, 0, 0]", "0 [0.0, 10.0, 20.0, 30.0]",
                                   "2 [0.0, 10.0, 20.0, 30.0]"], (out, err)


def test_a_sigint_as_a_forked_childs_handler_comes_back_ends_the_child():
    # sent just after a worker forks, it raised KeyboardInterrupt in the fork hook (as Python's
    # handler came back, or as the mask did with the worker's handler still there), where
    # Python drops it with a traceback (CI, 3.13: the test below): the child lived on. Here
    # each of those calls raises once as that signal does, deterministically
    script = textwrap.dedent("""
        import os, signal
        from jaxloader.workers import ties
        real = {"signal": signal.signal, "pthread_sigmask": signal.pthread_sigmask}
        def arriving(name, when):
            def call(*args):
                out = real[name](*args)
                if when(*args):
                    setattr(signal, name, real[name])  # (once)
                    raise KeyboardInterrupt  # (the SIGINT sent just then)
                return out
            return call
        cases = {"handler": ("signal", lambda s, h: h is signal.default_int_handler),
                 "mask": ("pthread_sigmask", lambda how, mask: how != signal.SIG_BLOCK)}
        for case, (name, when) in cases.items():
            real["signal"](signal.SIGINT, ties._left_to_the_trainer)  # (a worker's)
            child = os.fork()
            if child == 0:
                setattr(signal, name, arriving(name, when))
                try:
                    ties._signals_back_in_child()
                except BaseException:
                    os._exit(5)  # (raised out of the hook: Python would drop it, live on)
                os._exit(0)
            status = os.waitpid(child, 0)[1]
            print(case, os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT or
                  os.waitstatus_to_exitcode(status) == 128 + signal.SIGINT, status)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split()[1::3] == ["True", "True"], (done.stdout, done.stderr)


def test_a_child_a_worker_forks_keeps_the_transforms_mask_and_handlers_and_ends_on_sigint(
        tmp_path):
    # the worker's fork hooks unblocked SIGTERM in the forking thread and the child where the
    # transform had blocked it (to sigwait for it in the child), replaced a handler of the
    # transform's own in the child, and a SIGINT sent as the fork returned was lost (with a
    # traceback a time): the review of 990e4fb
    out, err, code = run(tmp_path, """
        def forks(r):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            child = os.fork()
            if child == 0:
                still = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
                signal.sigwait({signal.SIGTERM})
                os._exit(7 if still else 8)
            kept = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
            os.kill(child, signal.SIGTERM)
            masked = os.waitpid(child, 0)[1]
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            old = signal.signal(signal.SIGTERM, lambda *a: os._exit(42))  # (its clean-up)
            ready, told = os.pipe()
            child = os.fork()
            if child == 0:
                os.write(told, b"1")
                time.sleep(3)
                os._exit(0)
            os.read(ready, 1)
            os.kill(child, signal.SIGTERM)
            handled = os.waitpid(child, 0)[1]
            signal.signal(signal.SIGTERM, old)
            lived = 0
            for _ in range(10):
                child = os.fork()
                if child == 0:
                    try:
                        time.sleep(0.2)
                    except KeyboardInterrupt:
                        os._exit(3)
                    os._exit(0)
                os.kill(child, signal.SIGINT)
                lived += os.waitpid(child, 0)[1] == 0
            return {"y": np.array([kept, os.waitstatus_to_exitcode(masked),
                                   os.waitstatus_to_exitcode(handled), lived])}
        with loader([jl.Map(forks)], num_workers=1) as ld:
            print(next(iter(ld))["y"][0].tolist())
        """)
    assert code == 0, err
    assert out.split("\n")[0] == "[1, 7, 42, 0]" and "Traceback" not in err, (out, err)


def test_a_workers_print_output_to_a_file_is_kept_when_it_is_stopped(tmp_path):
    # a worker's standard output to a file or a pipe was buffered by the block, and a busy
    # worker is killed at close() and after a failing step: what it had printed went with it
    out, err, code = run(tmp_path, """
        def noisy(r):
            print("debug", int(r["y"]))
            time.sleep(30 if r["y"] == 5 else 0)  # (busy at close: killed)
            return r
        with loader([jl.Map(noisy)]) as ld:
            first = next(iter(ld))["y"].tolist()
        print("first", first)
        """, shell="> out.txt", env={k: v for k, v in os.environ.items()
                                     if k != "PYTHONUNBUFFERED"})  # (python -u writes at once)
    assert code == 0, err
    printed = (tmp_path / "out.txt").read_text().split("\n")
    assert {f"debug {i}" for i in (0, 1, 2, 3, 4, 5)} <= set(printed), printed



def test_a_workers_print_is_one_write_a_line_under_pythonunbuffered(tmp_path):
    # PYTHONUNBUFFERED=1 (Docker images, this machine) left write_through on: print("a", b)
    # wrote each piece apart, and two workers' lines came out cut into each other
    out, err, code = run(tmp_path, """
        import sys
        def states(r):
            return {"y": np.array([sys.stdout.line_buffering, sys.stdout.write_through,
                                   sys.stderr.write_through])}
        with loader([jl.Map(states)], num_workers=1) as ld:
            print(next(iter(ld))["y"][0].tolist())
        """, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert code == 0, err
    assert out.split("\n")[0] == "[True, False, False]", (out, err)

def test_an_error_of_a_class_the_script_defines_is_the_cause_with_workers(tmp_path):
    # pickle names a class by its module, and a worker's __main__ has no such class: the
    # chain ended at the RecordError with workers (except MyError caught it with 0 workers)
    out, err, code = run(tmp_path, """
        import re
        class BadRecord(Exception):
            pass
        def check(r):
            if r["y"] == 2:
                raise BadRecord(f"record {int(r['y'])}")
            return r
        for workers in (0, 2):
            with loader([jl.Map(check)], num_workers=workers) as ld:
                try:
                    next(iter(ld))
                except jl.JaxloaderError as e:
                    cause = e.__cause__
                    while cause is not None and not isinstance(cause, BadRecord):
                        cause = cause.__cause__
                    print(workers, type(cause).__name__, cause)
                    print(workers, re.search(r'script.py", line \\d+, in check', str(e))
                          is not None)
        def stop_here(r):  # (a debugger in a worker: told to debug with num_workers=0)
            breakpoint()
            return r
        with loader([jl.Map(stop_here)]) as ld:
            try:
                next(iter(ld))
            except jl.WorkerError as e:
                print("debugger:", "debug the transform with num_workers=0" in str(e))
        """, shell="< /dev/null")
    assert code == 0, err
    assert out.split("\n")[:4] == ["0 BadRecord record 2", "0 False", "2 BadRecord record 2",
                                   "2 True"], (out, err)  # (a worker's traceback: its line)
    assert "debugger: True" in out.split("\n"), (out, err)


def test_a_workers_logging_and_warnings_of_the_scripts_own_kinds(tmp_path):
    # a warning filter on a category the script defines crashed every worker as it started
    # (pickle names the class by __main__); a worker_init_fn that configures logging logs
    # there; a record whose extra= does not pickle comes as its message
    out, err, code = run(tmp_path, """
        import logging, threading, warnings
        def old_api(r):
            warnings.warn("old_api is deprecated", DeprecationWarning)
            return r
        with loader([jl.Map(old_api)]) as ld:
            list(ld)  # (a script's DeprecationWarning is shown, once: __main__'s, as without)
        class Blank(UserWarning):
            pass
        warnings.simplefilter("error", Blank)
        def warn(r):
            if r["y"] == 5:
                logging.getLogger("aug").warning("odd", extra={"lock": threading.Lock()})
                warnings.warn(Blank("blank record 5"))
            return r
        with loader([jl.Map(warn)]) as ld:
            try:
                list(ld)
            except jl.WorkerError as e:
                print("raised", type(e.__cause__).__name__, type(e.__cause__.__cause__).__name__)
        def init(i):
            logging.basicConfig(format="worker-format %(processName)s %(message)s")
            logging.getLogger("init").warning("started %d", i)
        warnings.simplefilter("ignore", Blank)
        with loader([jl.Map(warn)], num_workers=1, worker_init_fn=init) as ld:
            list(ld)
        """, shell="< /dev/null")
    assert code == 0, err
    assert out.split("\n")[0] == "raised RecordError Blank", (out, err)
    lines = err.splitlines()
    assert sum("DeprecationWarning: old_api is deprecated" in line for line in lines) == 1, err
    assert "odd" in lines, err  # (the trainer's last resort: the record, less its extra)
    assert "worker-format jaxloader-worker-0 started 0" in lines, err
    assert "worker-format jaxloader-worker-0 odd" in lines, err  # (the worker's own handler)


def test_a_forked_workers_handler_writes_a_record_once_and_a_late_one_is_kept(tmp_path):
    # a forked worker wrote a named logger's record with the handler it inherited, and sent it
    # to the trainer too, which wrote it again; a warning kept at a worker's exit crashed it
    out, err, code = run(tmp_path, """
        import atexit, logging, warnings
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("AUG %(processName)s %(message)s"))
        logging.getLogger("aug").addHandler(handler)
        def blank(r):
            if r["y"] == 1:
                logging.getLogger("aug").warning("record 1 is blank")
            return r
        with loader([jl.Map(blank)], num_workers=1, start_method="fork") as ld:
            list(ld)
        def init(i):
            atexit.register(lambda: (logging.getLogger("late").warning("at exit %d", i),
                                     warnings.warn("a late warning")))
        with loader(num_workers=1, worker_init_fn=init) as ld:
            list(ld)
        """, shell="< /dev/null")
    assert code == 0, err
    assert out.splitlines() == ["AUG jaxloader-worker-0 record 1 is blank"], (out, err)
    assert "jaxloader-worker-0 WARNING late: at exit 0" in err.splitlines(), err
    assert "UserWarning: a late warning" in err and "Traceback" not in err, err


def test_a_pool_a_transform_forks_warns_as_python_does(tmp_path):
    # its children inherited the worker's relay (each warning shown again, never once)
    (tmp_path / "pool_child.py").write_text(
        "import logging, warnings\ndef child(i):\n    warnings.warn('the same warning')\n"
        "    return i\ndef log_it():\n    logging.getLogger('kid').warning('from the child')\n")
    out, err, code = run(tmp_path, """
        import multiprocessing
        sys.path.insert(0, os.getcwd())
        from pool_child import child
        def fan_out(r):
            with multiprocessing.get_context("fork").Pool(1) as pool:
                pool.map(child, range(20))
            print("a pool", flush=True)
            return r
        with loader([jl.Map(fan_out)], num_workers=1) as ld:
            next(iter(ld))
        pools = {}
        def start_pool(worker_id):  # (forked as worker_init_fn runs: its records were lost)
            pools["pool"] = multiprocessing.get_context("fork").Pool(1)
        def in_pool(r):
            from pool_child import log_it
            pools["pool"].apply(log_it)
            return r
        with loader([jl.Map(in_pool)], num_workers=1, worker_init_fn=start_pool) as ld:
            next(iter(ld))
        """, shell="< /dev/null")
    assert code == 0, err
    assert err.count("UserWarning: the same warning") == out.count("a pool") > 0, (out, err)
    assert "from the child" in err.splitlines(), err  # (Python's last resort: the message)


def test_a_child_the_worker_forks_ends_on_a_sigterm_that_came_before_its_handlers_were_reset():
    # a Pool ended as one of its children still started: the SIGTERM came while the child had
    # the worker's handler, which does nothing, and the Pool's terminate() waited for it
    code = textwrap.dedent("""
        import os, signal, sys, time
        sys.path.insert(0, %r)
        from jaxloader.workers import ties
        ties.leave_signals_to_the_trainer()
        child = os.fork()
        if child == 0:
            signal.signal(signal.SIGTERM, ties._left_to_the_trainer)  # (as before the reset)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(0)
        status = os.waitpid(child, 0)[1]
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # (the worker itself: left to the trainer)
        print("worker on")
        """ % ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["True", "worker", "on"], (done.stdout, done.stderr)


def test_64_bit_jax_reaches_a_maps_jax_numpy_in_the_workers():
    # a Map computing with jax.numpy made int64 in this process and int32 in the workers, its
    # values past 2**31 wrapped, after jax.config.update('jax_enable_x64', True) (the device
    # audit; a JitMap is told its own)
    script = textwrap.dedent("""
        import jax, numpy as np, jaxloader as jl
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        src = jl.ArraySource({"t": np.arange(8, dtype=np.int64) * 2**33})
        for workers in (0, 2):
            with jl.DataLoader(src, batch_size=4, num_workers=workers, process_index=0,
                               process_count=1,
                               transforms=[lambda r: {"t": jnp.asarray(r["t"]) + 1}]) as loader:
                b = next(iter(loader))
            print(workers, b["t"].dtype, b["t"].tolist())
    """)
    first = "int64 [1, 8589934593, 17179869185, 25769803777]"
    base = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    for said in ({}, {"JAX_ENABLE_X64": "0"}):  # (an environment's 0 won over the process's
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=120, env={**base, "JAX_PLATFORMS": "cpu", **said})  # own)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.splitlines() == [f"0 {first}", f"2 {first}"], out.stdout
    context = textwrap.dedent("""
        import jax, jax.experimental, numpy as np, jaxloader as jl  # noqa
        import jax.numpy as jnp
        x64 = getattr(jax.experimental, "enable_x64", None) or jax.enable_x64
        src = jl.ArraySource({"t": np.arange(8, dtype=np.int64) * 2**33})
        def trial(out):  # (a thread's loader: its workers were started from another thread,
            with x64(True):  # where the context does not hold)
                with jl.DataLoader(src, batch_size=4, num_workers=2, process_index=0,
                                   process_count=1, transforms=[
                                       lambda r: {"t": jnp.asarray(r["t"]) + 1}]) as loader:
                    out.append(next(iter(loader))["t"])
        import threading
        got = []
        thread = threading.Thread(target=trial, args=(got,))
        thread.start()
        thread.join()
        print(got[0].dtype, got[0].tolist())
    """)
    out = subprocess.run([sys.executable, "-c", context], capture_output=True, text=True,
                         timeout=120, env={**base, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == first, out.stdout


def test_a_worker_added_after_a_jax_enable_x64_context_gets_the_loaders_64_bit_jax():
    # the loader made in the context; a worker the tuner adds once it has ended (as monitor.py
    # does, from the thread that asks for batches) made int32: values past 2**31 wrapped
    # (the twentieth review)
    script = textwrap.dedent("""
        import os, jax, jax.experimental, numpy as np, jaxloader as jl  # noqa
        import jax.numpy as jnp
        x64 = getattr(jax.experimental, "enable_x64", None) or jax.enable_x64
        src = jl.ArraySource({"t": np.arange(64, dtype=np.int64) * 2**33})
        def plus_one(r):
            return {"t": np.asarray(jnp.asarray(r["t"]) + 1).astype(np.int64),
                    "want": r["t"] + 1, "pid": np.int64(os.getpid())}
        with x64(True):
            loader = jl.DataLoader(src, batch_size=4, num_workers="auto", process_index=0,
                                   process_count=1, shuffle=False, transforms=[plus_one])
        with loader:
            it = iter(loader)
            next(it)
            loader._engine.roster.resize(2)  # (the tuner's call)
            wrong, pids = [], set()
            for b in it:
                pids.update(b["pid"].tolist())
                wrong += [t for t, w in zip(b["t"].tolist(), b["want"].tolist()) if t != w]
        print(len(pids), wrong[:3])
    """)
    base = {k: v for k, v in os.environ.items() if k != "JAX_ENABLE_X64"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env={**base, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "2 []", out.stdout


def _limit(record):
    return {"limit": np.int64(sys.getrecursionlimit())}


def test_workers_run_under_the_trainers_recursion_limit():
    # a script's sys.setrecursionlimit(10_000) for a deep transform: the workers kept
    # Python's 1,000, and the transform raised RecursionError with workers alone
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(4321)
    try:
        with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2, num_workers=2,
                           transforms=[jl.Map(_limit)]) as ld:
            assert {int(v) for b in ld for v in b["limit"]} == {4321}
    finally:
        sys.setrecursionlimit(before)
