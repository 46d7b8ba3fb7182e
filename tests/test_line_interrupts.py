"""The interrupt helpers: ``raised_at_place`` reaches the very points ``raised_at_point``
counts, so a sweep that lists a call's points once tests the points it tested one by one."""

import functools
import os

from line_interrupts import numbered, points_of, raised_at_place, raised_at_point

HERE = os.path.abspath(__file__)  # (the "package" whose points count: this file)


def _toy(log):
    """A generator resumed, a recursion, a loop: places passed over several times."""
    def numbers():
        for i in range(3):
            log.append(("yield", i))
            yield i

    def down(n):
        log.append(("down", n))
        if n:
            down(n - 1)
        log.append(("up", n))

    for v in numbers():
        down(v)
        log.append(("loop", v))


def test_each_point_is_reached_alone_as_the_kth_pass_over_its_place():
    places = points_of(HERE, functools.partial(_toy, []))
    assert len(places) > len(set(places)) > 10  # (places passed more than once)
    for n, (place, k) in enumerate(numbered(places), 1):
        counted, placed = [], []
        assert raised_at_point(n, HERE, functools.partial(_toy, counted))
        assert raised_at_place(place, k, functools.partial(_toy, placed))
        assert counted == placed, f"point {n}: {counted} against {placed}"
    assert not raised_at_point(len(places) + 1, HERE, functools.partial(_toy, []))
    assert not raised_at_place(places[0], places.count(places[0]) + 1, functools.partial(_toy, []))


def test_a_tick_raised_by_line_never_leaves_a_with_statements_lock_held():
    # The line event on a with's exit came before __exit__ and outside its handler: a Tick
    # there left the lock held by this thread, and a later close() from another thread, which
    # takes it (SlotRing.close), waited for ever (CI: test_lifecycle's 600 s timeout)
    import threading

    from line_interrupts import Tick, raised_at_line

    lock = threading.RLock()

    def guarded(log):
        with lock:
            log.append(1)
        log.append(2)

    n = 0
    while True:
        n += 1
        try:
            raised = raised_at_line(n, [guarded], functools.partial(guarded, []))
        except Tick:
            raised = True
        taken: list = []

        def take() -> None:
            taken.append(lock.acquire(timeout=2.0))
            if taken[-1]:
                lock.release()

        other = threading.Thread(target=take)
        other.start()
        other.join()
        assert taken == [True], f"line {n}: the lock is still held"
        if not raised:
            break
    assert n >= 4, n  # (with, the body, after it: each interrupted in turn)
