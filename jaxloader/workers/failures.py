"""What the pool says when a worker raises, dies or cannot be sent its work (a late batch
is said by ``stalls.py``). Every message names the worker, its pid, what it was doing (the
step and record positions, from its status row: ``status.py``) and what to do; a raise
carries the worker's traceback and, when it pickles, the exception itself as the cause. A
payload that does not pickle is said with the part of it that does not (``unpicklable``): the
transform, source or ``worker_init_fn``, and in it what holds the object (``_culprit``).

Example:
    >>> from jaxloader.workers.protocol import Failed
    >>> error, _ = raised(1, 4242, Failed(3, 25, "ValueError: bad", "Traceback ...", None),
    ...                   lambda step: f"step {step}")
    >>> str(error).splitlines()[0]
    'worker 1 (pid 4242) raised at step 25: ValueError: bad'
"""

from __future__ import annotations

import dis
import functools
import inspect
import io
import os
import pickle
import signal
import sys
from typing import Any, Callable, Iterable

import numpy as np

from jaxloader.base.abilities import parts_of
from jaxloader.base.errors import (CollateError, JaxloaderError, SharedMemoryError,
                                   WorkerError)
from jaxloader.base.mapped_files import changed_under
from jaxloader.runtime.limits import memory_left
from jaxloader.runtime.shm import Segment
from jaxloader.workers import payload
from jaxloader.workers.launch import EXIT_UNKNOWN
from jaxloader.workers.protocol import Failed, chain
from jaxloader.workers.status import StatusBoard


def raised(worker: int, pid: int | str, failed: Failed, where: Callable[[int], str],
           who: str = "worker", maker: Any = None) -> tuple[WorkerError, BaseException | None]:
    """The error for worker ``worker``'s failure report, and its cause (``where(step)`` names
    a step; ``who``: what the worker is, a Ray actor's ``"Ray actor"``, whose ``pid`` says
    its node too; ``maker``: the
    loader's batch maker, whose source's memory-mapped files changed since it was made are
    said where the worker failed to start)."""
    doing = "while starting (loading the payload or running worker_init_fn)"
    changed = changed_under(getattr(maker, "source", None)) if failed.step is None else None
    if failed.step is not None:
        try:  # (a step past the epochs: its place raises as its batch did)
            doing = f"at {where(failed.step)}"
        except Exception:  # noqa: BLE001 - (said in its turn, not at once)
            doing = f"at step {failed.step:,}"
    cause = None
    try:
        cause = None if failed.pickled is None else chain(failed.pickled)
    except Exception:  # noqa: BLE001 - the text below still says what happened
        pass
    if isinstance(cause, CollateError) and failed.step is not None:
        cause.args = (f"{doing[3:]}: {cause}",)  # (its step first, as in the training process)
    return WorkerError(
        f"{who} {worker} (pid {pid}) raised {doing}: {failed.summary}{_not_found(cause)}"
        + (f"; in this process, {changed}" if changed else "") +
        f"{_DEBUGGER if 'bdb.BdbQuit' in failed.traceback else ''}\n"
        f"--- traceback in the {who.split()[-1]} ---\n{failed.traceback.rstrip()}\n"
        "--- the loader is broken; fix the cause and create a new loader ---"), cause


_DEBUGGER = (" (a debugger stopped in a worker, which reads no terminal of its own: debug the "
             "transform with num_workers=0)")


def _not_found(cause: BaseException | None) -> str:
    """Where this process found a module a worker could not import (a notebook that changed
    directory since it imported a module from the one it was in: a worker's ``''`` on
    ``sys.path`` is its directory now), and the remedy; ``""`` for other causes."""
    name = getattr(cause, "name", None) if isinstance(cause, ModuleNotFoundError) else None
    where = getattr(sys.modules.get(name or ""), "__file__", None)
    if not name or not where:
        return ""
    folder = os.path.dirname(where)
    for _ in range(name.count(".") + os.path.basename(where).startswith("__init__.")):
        folder = os.path.dirname(folder)  # (the folder a package is found in)
    here = f" (its '' is the directory of the moment, {os.getcwd()})" if "" in sys.path else ""
    return (f" (this process imported {name} from {where}, which the worker's sys.path does "
            f"not find{here}: put {folder} on sys.path, or PYTHONPATH, before making the "
            "loader)")


# the signals faulthandler dumps the stacks on (native code that crashed)
_FATAL_SIGNALS = {signal.SIGSEGV, signal.SIGFPE, signal.SIGABRT, signal.SIGBUS, signal.SIGILL}


def died(worker: int, pid: int, code: int | None, board: StatusBoard,
         where: Callable[[int], str], starter: tuple[int, int | None] | None = None
         ) -> WorkerError:
    """The error for worker ``worker``, gone with exit code ``code`` (negative: a signal),
    named with the step its status row says it started, else the step the loader awaited
    (``board.awaited``); ``starter``: the pid and exit code of the worker starter, where it ended
    first (its workers end with it)."""
    step = board.making(worker)
    how = _ended(code)
    if starter is not None:  # (not the worker's doing: it was blamed on the OOM killer)
        how = (f"the worker starter (pid {starter[0]}, the process that starts the workers) "
               f"ended first, {_ended(starter[1])}, and its workers end with it")
    elif code is not None and code < 0 and -code == 9:
        how += " (SIGKILL: often the out-of-memory killer)"
    elif code is not None and code < 0 and -code == 7:
        how += (" (SIGBUS: memory it mapped lost its pages: a memory-mapped file the source "
                "reads, np.load(..., mmap_mode='r'), truncated or rewritten as it was read; "
                "replace such a file by renaming a new one into place)")
    elif code is not None and code < 0 and -code in _FATAL_SIGNALS and "ulimit -v" in (
            limit := memory_left()):  # (native code, XLA's, aborts where it cannot map more)
        how += f" ({limit.split('; ')[0]}, which a worker's native code may have met)"
    doing = f"while making {where(step)}" if step is not None else (
        "while starting" if board.starting(worker) else "while idle" + (
            f", the loader awaiting {where(board.awaited)}" if board.awaited is not None
            else ""))
    stacks = board.crash(worker) if code is not None and -code in _FATAL_SIGNALS else None
    return WorkerError(
        f"worker {worker} (pid {pid}) died {doing}: {how}; the loader is broken; "
        + ("check what ended it (a signal sent to it, the out-of-memory killer: its size is "
           "the training process's start), then create a new loader, which starts a new one"
           if starter is not None else "check memory use and native code in transforms, then "
           "create a new loader")
        + (f"\n--- the worker's Python stacks as the signal came ---\n{stacks}" if stacks
           else ""))


def _ended(code: int | None) -> str:
    if code == EXIT_UNKNOWN:
        return ("its exit code unknown (this process's children are reaped by another: "
                "SIGCHLD ignored, or a handler of its own calling waitpid)")
    return f"exit code {code}" if code is None or code >= 0 else f"killed by signal {-code}"


def pickled(maker: Any, init_fn: Any, keep: Callable[[Any], None], note: Callable) -> bytes:
    """The workers' payload (``payload.dumps``); what cannot be pickled said by
    ``unpicklable`` (out of memory to share it in, or a Ctrl-C: said as it is)."""
    try:
        return payload.dumps((maker, init_fn), keep, note)
    except SharedMemoryError:
        raise
    except MemoryError as e:  # (was told to make it picklable: the containers audit)
        raise MemoryError(f"out of memory as the loader pickled the workers' source and "
                          f"transforms to send them: {memory_left()}; keep less of the source "
                          "in memory (read it from files, np.load(path, mmap_mode='r')), or "
                          "use num_workers=0") from e
    except Exception as e:
        raise unpicklable(e, maker, init_fn) from e


def unpicklable(e: Exception, maker: Any, init_fn: Any,
                to: str = "worker processes") -> WorkerError:
    """The error for a payload that cannot be sent ``to`` the workers: which part of it, found
    by sending each."""
    suspects = [("source", maker.source), ("worker_init_fn", init_fn)]
    suspects += [("transform", t) for t in maker.record_transforms + maker.batch_transforms]
    for name, obj in suspects:
        inner = _unsendable(obj)
        if inner is not None:
            part, below = "", obj
            if name == "source":  # (a source made of others: the innermost that fails)
                while True:
                    failing = next(((p, why) for p in parts_of(below)
                                    if (why := _unsendable(p)) is not None), None)
                    if failing is None:
                        break
                    below, inner = failing
                if below is not obj:
                    part = f": its part {_repr(below)}"
            held = _culprit(below, {id(below)})
            part += f": the object at {held} does not pickle" if held else ""
            return WorkerError(
                f"cannot send the {name} {_repr(obj)} to {to}{part}: "
                f"{type(inner).__name__}: {inner}; make it picklable by cloudpickle (no open "
                "files, locks or sockets; open them lazily in the worker, and leave out in "
                "__getstate__ one the training process opened: peek(), num_workers=0 and "
                "state_dict() read records there), or "
                + ("use num_workers=0" if to == "worker processes" else "run the loader "
                   "without workers=")
            )
    return WorkerError(f"cannot send the loader to {to}: {type(e).__name__}: {e}")


def _culprit(obj: Any, seen: set[int], depth: int = 6) -> str:
    """Where in ``obj`` (which does not pickle) the part that does not is held, the smallest
    found: ``"scale's global 'lock' (<unlocked _thread.lock ...>)"``; ``""`` where no part of
    it alone fails. Probes each part (``_parts``) once; an error's path only."""
    try:
        parts = list(_parts(obj))
    except Exception:  # noqa: BLE001 - its own reduction fails: it is the smallest found
        return ""
    for name, part in parts:
        if id(part) in seen or not _fails_alone(part):
            continue
        seen.add(id(part))
        deeper = _culprit(part, seen, depth - 1) if depth else ""
        return f"{name}{' > ' + deeper if deeper else f' ({_repr(part)})'}"
    return ""


class _Probe(payload._Pickler):
    """The payload's pickler, but arrays are left out (a probe copies none) and nothing kept."""

    def persistent_id(self, obj: Any) -> Any:
        return 0 if isinstance(obj, np.ndarray) and obj.dtype != object else None


def _fails_alone(part: Any) -> bool:
    try:
        _Probe(io.BytesIO(), lambda segment: None).dump(part)
    except Exception:  # noqa: BLE001 - any pickler's error says it fails
        return True
    return False


def _repr(obj: Any) -> str:
    try:
        said = repr(obj)
    except Exception:  # noqa: BLE001 - a name in a message being said
        return f"a {type(obj).__name__}"
    return said if len(said) <= 80 else said[:77] + "..."


def _parts(obj: Any) -> Iterable[tuple[str, Any]]:
    """What ``obj`` holds that cloudpickle sends with it, named: a function's captured
    variables, globals and defaults, a method's object, a partial's function and arguments,
    an object's attributes, a container's items."""
    if inspect.ismethod(obj):
        yield f"{obj.__name__}'s object", obj.__self__
        obj = obj.__func__
    if inspect.isfunction(obj):
        code, name = obj.__code__, obj.__name__
        cells = zip(code.co_freevars, obj.__closure__ or ())
        yield from ((f"{name}'s captured variable {v!r}", c.cell_contents) for v, c in cells)
        yield from ((f"{name}'s global {g!r}", obj.__globals__[g])
                    for g in sorted(_globals_loaded(code)) if g in obj.__globals__)
        yield from ((f"{name}'s default {d!r}", v) for d, v in zip(
            code.co_varnames[code.co_argcount - len(obj.__defaults__ or ()):],
            obj.__defaults__ or ()))
        yield from ((f"{name}'s default {d!r}", v) for d, v in (obj.__kwdefaults__ or {}).items())
    elif isinstance(obj, functools.partial):
        yield "the partial's function", obj.func
        yield from ((f"the partial's argument {i}", a) for i, a in enumerate(obj.args))
        yield from ((f"the partial's argument {k!r}", a) for k, a in obj.keywords.items())
    elif isinstance(obj, dict):
        yield from ((f"item {k!r:.40}", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        yield from ((f"item {i}", v) for i, v in enumerate(obj))
    elif isinstance(obj, type):  # (a class of __main__ crosses by value, its attributes too)
        yield from ((f"{obj.__name__}.{a}", v) for a, v in vars(obj).items()
                    if not a.startswith("__") or inspect.isfunction(v))
    else:  # what pickle sends of it: its reduction's arguments and state (__getstate__'s)
        kind, reduced = type(obj).__name__, obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        if not isinstance(reduced, tuple):
            return
        yield from ((f"{kind}'s class" if a is type(obj) else f"{kind}'s argument {i}", a)
                    for i, a in enumerate(reduced[1]))
        state = reduced[2] if len(reduced) > 2 else None
        for each in state if isinstance(state, tuple) else (state,):
            if isinstance(each, dict):
                yield from ((f"{kind}.{a}", v) for a, v in each.items())
            elif each is not None:
                yield f"{kind}'s state", each


def _globals_loaded(code: Any) -> set[str]:
    """The globals ``code`` (and code nested in it: a generator expression's) reads or sets:
    what cloudpickle sends of a function's globals (``co_names`` holds attributes' names too)."""
    found = {i.argval for i in dis.get_instructions(code)
             if i.opname in ("LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL")}
    for const in code.co_consts:
        if inspect.iscode(const):
            found |= _globals_loaded(const)
    return found


def _unsendable(obj: Any) -> Exception | None:
    """Why ``obj`` cannot be sent to a worker (``payload.dumps``'s error), or ``None``."""
    shared: list[Segment] = []
    try:
        payload.dumps(obj, shared.append)
    except Exception as inner:  # noqa: BLE001 - any pickler's error is the answer
        return inner
    finally:
        for segment in shared:  # only a probe: nothing will read these
            segment.destroy()
    return None


def forked(owner: int) -> JaxloaderError:
    """A loader's workers used from a process forked after they started: its messages would
    be read from, and its tasks sent down, the pipes of the process that owns them (``owner``),
    whose batches then go missing or hang."""
    return JaxloaderError(
        f"this loader's workers belong to process {owner}, which forked this one "
        f"({os.getpid()}): a forked process cannot use them; make a loader in it (or iterate "
        "with num_workers=0), and leave the parent's loader to the parent")


def closed() -> JaxloaderError:
    """What a run waiting for a batch raises when ``close()`` (from another thread, or at the
    interpreter's exit) killed the workers: not their death, which would blame memory."""
    return JaxloaderError("the loader was closed (close() from another thread, or at exit) "
                          "while this iterator waited for a batch; make a new loader to go on")
