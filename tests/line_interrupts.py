"""Interrupts raised at a chosen line of chosen functions (for tests of interrupt safety).

``Tick`` stands in for ``KeyboardInterrupt``, which pytest would take as the user stopping the
run. ``raised_at_line`` runs a call with a tracer that raises ``Tick`` at the ``n``-th line
executed inside the given functions, so a test can put an interrupt between every two lines of
a piece of bookkeeping in turn, deterministically. ``raised_at_point`` does the same at the
points of a whole package where a real Ctrl-C can land, for sweeps of whole calls;
``points_of`` lists a call's points once (``numbered``: each with its pass over its place)
and ``raised_at_place`` reaches one of them without following the rest of the package opcode
by opcode.
"""

from __future__ import annotations

import dis
import gc
import sys
import types
from typing import Any, Callable, Iterator


class Tick(BaseException):
    pass


def raised_at_line(n: int, functions: list[Callable[..., Any]], call: Callable[[], Any]) -> bool:
    """Runs ``call()``, raising ``Tick`` at the ``n``-th line run inside ``functions``; True if
    it was raised (False: ``call`` ran fewer lines there, and finished)."""
    codes = {f.__code__ for f in functions}
    seen = 0

    def tracer(frame, event, arg):
        if frame.f_code not in codes:
            return None

        def line(frame, event, arg):
            nonlocal seen
            if event == "line" and not _before_a_with_exit(frame.f_code, frame.f_lasti):
                seen += 1
                if seen == n:
                    raise Tick()
            return line
        return line

    return _raised(tracer, call)


def _before_a_with_exit(code: types.CodeType, offset: int) -> bool:
    """Whether the instruction at ``offset`` starts a ``with`` statement's exit, the normal one
    (``__exit__(None, None, None)`` loaded and called) or the handler's: the line event there
    comes before the call that releases what the ``with`` holds, and outside the range its
    handler covers, so a ``Tick`` raised there left a lock held for good (a later close() from
    another thread waited for ever: CI's 600 s timeout in test_lifecycle). A real Ctrl-C does
    not land there: no call returns between the body's end and ``__exit__``'s."""
    ops = _instructions(code)
    at = next((i for i, op in enumerate(ops) if op.offset == offset), None)
    if at is None:
        return False
    if ops[at].opname == "PUSH_EXC_INFO":
        return True
    following = ops[at:at + 4]
    return (len(following) == 4 and all(op.opname == "LOAD_CONST" and op.argval is None
                                        for op in following[:3])
            and following[3].opname in ("PRECALL", "CALL"))


_INSTRUCTIONS: dict[types.CodeType, list[dis.Instruction]] = {}


def _instructions(code: types.CodeType) -> list[dis.Instruction]:
    if code not in _INSTRUCTIONS:
        _INSTRUCTIONS[code] = list(dis.get_instructions(code))
    return _INSTRUCTIONS[code]


Place = tuple[types.CodeType, int]  # a code object and an offset in it (-1: the code's start)


def raised_at_point(n: int, package: str, call: Callable[[], Any]) -> bool:
    """Runs ``call()``, raising ``Tick`` at the ``n``-th point inside the code of ``package``
    (a directory) where CPython may run a signal handler: a function's start, just after a
    call returns (a builtin's or a function's; the latter is finer than CPython, which checks
    there only after builtins) and a loop's back edge; True if it was raised. Between two such
    points (stores, arithmetic, a ``return``) a real Ctrl-C cannot land, which a line-by-line
    tracer does not know."""
    seen = 0

    def hit(place: Place) -> None:
        nonlocal seen
        seen += 1
        if seen == n:
            raise Tick()

    # (also raised where Python prints and drops it: in a generator the GC closes)
    return _raised(_point_tracer(lambda code: code.co_filename.startswith(package), hit),
                   call) or seen >= n


def points_of(package: str, call: Callable[[], Any]) -> list[Place]:
    """Runs ``call()`` to its end: the places of the points ``raised_at_point`` counts in it, in
    the order they are reached (a place once per pass)."""
    places: list[Place] = []
    _raised(_point_tracer(lambda code: code.co_filename.startswith(package), places.append),
            call)
    return places


def raised_at_place(place: Place, k: int, call: Callable[[], Any]) -> bool:
    """Runs ``call()``, raising ``Tick`` at the ``k``-th pass (from 1) over ``place``: in a
    deterministic call, the point ``raised_at_point`` reaches as the ``k``-th of that place in
    ``points_of``. Only the frames of that place's code are followed opcode by opcode, so a
    point late in a long call costs about what an early one does."""
    seen = 0

    def hit(at: Place) -> None:
        nonlocal seen
        if at == place:
            seen += 1
            if seen == k:
                raise Tick()

    return _raised(_point_tracer(lambda code: code is place[0], hit), call) or seen >= k


def numbered(places: list[Place]) -> Iterator[tuple[Place, int]]:
    """Each point of ``places`` (``points_of``'s list) as ``(place, k)``: the arguments of
    ``raised_at_place`` that reach it (the k-th pass over its place)."""
    passes: dict[Place, int] = {}
    for place in places:
        passes[place] = passes.get(place, 0) + 1
        yield place, passes[place]


def _point_tracer(follows: Callable[[types.CodeType], bool],
                  hit: Callable[[Place], None]) -> Callable[..., Any]:
    """A ``sys.settrace`` function calling ``hit(place)`` at each point (see ``raised_at_point``)
    of the code objects ``follows`` accepts."""

    def tracer(frame, event, arg):
        code = frame.f_code
        if not follows(code):
            return None
        frame.f_trace_opcodes = True
        hit((code, -1))  # the function's start
        after_call = False

        def opcode(frame, event, arg):
            nonlocal after_call
            frame.f_trace_opcodes = True  # (3.12+: set at the call event, it starts late)
            if event == "opcode":
                at = frame.f_lasti
                name = dis.opname[code.co_code[at]]
                if after_call or name == "JUMP_BACKWARD":
                    after_call = False
                    hit((code, at))
                after_call = name in _CALLS
            return opcode
        return opcode
    return tracer


_CALLS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}


def _raised(tracer: Callable[..., Any], call: Callable[[], Any]) -> bool:
    """Runs ``call()`` under ``tracer``, the garbage collector off (the finalizers it runs
    would run package code at other moments in each run, and move the points); True if
    ``Tick`` came out of it."""
    collecting = gc.isenabled()
    gc.disable()
    here = sys._getframe()
    opcodes = here.f_trace_opcodes
    # (3.12 only: opcode events come only where some frame asked for them before settrace;
    # the tracer's own setting of f_trace_opcodes then takes effect, as it does elsewhere)
    here.f_trace_opcodes = sys.version_info[:2] == (3, 12) or opcodes
    sys.settrace(tracer)
    try:
        call()
    except Tick:
        return True
    finally:
        sys.settrace(None)
        here.f_trace_opcodes = opcodes
        if collecting:
            gc.enable()
    return False
