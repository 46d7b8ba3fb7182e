"""The training process's CPU a batch, two trees side by side: what a change to the per-batch
path costs (the stage timings' cost was measured with it).

    python benchmarks/bench_overhead.py --before OLD_CHECKOUT [--after CHECKOUT ...]
        [--rounds 10] [--control]

Each round starts, for each case, one process a tree (``PYTHONPATH`` puts the tree's
``jaxloader`` first), warms it (300 batches) and lets the two take turns, ABBA..., ``--turns``
pairs of chunks; a chunk is the training process's CPU (``time.process_time``) over its
batches. A neighbour's load or a change of the machine's speed falls on both chunks of a pair,
which separate runs did not share: their spread was larger than the 1% to measure. A process's
own placement in memory moves it by a few per cent, and so does which of the two started
first: each round starts fresh processes, the trees taking turns at starting first. The table
gives, per case, the median over rounds of a round's median pair ratio, and their range.
``--control`` also runs the after tree against itself: the floor of the method, in the same run.
``--count-lines`` counts instead the lines of Python the training process runs a batch in each
tree (``sys.monitoring``, after the same warm-up; the median of 3 processes and their range).
``--receipt-cost`` times what a receipt of a worker's message runs for the timings in this tree
(a large batch is a receipt of its own): the lines of ``WorkerPool._receive`` (copied here), and
a timed receipt's calls with its timed hand-over's.

Cases (``--cases``), each a shuffled ``ArraySource`` read without an end of epoch:
- ``in-process``: ``num_workers=0``, batches of 256 records of 16 float32 (the whole batch's CPU);
- ``workers-small``: the same batches made by 2 workers (the training process alone);
- ``workers-large``: 2 workers, batches of 64 records of 150 KiB.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = {  # name: (workers, batch size, floats a record, rows, batches a chunk)
    "in-process": (0, 256, 16, 1 << 20, 1000),
    "workers-small": (2, 256, 16, 1 << 20, 1000),
    "workers-large": (2, 64, 38_400, 1024, 40),
}


def child(case: str, count_lines: bool = False) -> None:
    """Serves chunks: reads a count from stdin, answers the CPU a batch in us (0 ends); or,
    ``count_lines``, the lines of Python this process runs a batch over 600 batches."""
    import numpy as np

    import jaxloader as jl

    workers, batch_size, width, rows, _ = CASES[case]
    x = np.random.default_rng(0).random((rows, width), np.float32)
    with jl.DataLoader(jl.ArraySource({"x": x}), batch_size=batch_size, shuffle=True,
                       num_workers=workers, num_epochs=None, process_index=0,
                       process_count=1) as loader:
        it = iter(loader)
        for _ in range(300):
            next(it)
        if count_lines:
            print(json.dumps({"jaxloader": jl.__file__, "lines": lines_a_batch(it, 600)}))
            return
        print(json.dumps({"jaxloader": jl.__file__}), flush=True)
        for line in sys.stdin:
            n = int(line)
            if n == 0:
                break
            cpu = time.process_time()
            for _ in range(n):
                next(it)
            print(json.dumps(1e6 * (time.process_time() - cpu) / n), flush=True)


def lines_a_batch(it, n: int) -> float:
    """Lines of Python run a batch by this process over ``n`` batches (``sys.monitoring``,
    Python 3.12 or newer): a count that the machine's speed does not move."""
    monitoring = sys.monitoring  # type: ignore[attr-defined]
    tool, lines = 3, [0]

    def line(code, number):
        lines[0] += 1

    monitoring.use_tool_id(tool, "bench_overhead")
    monitoring.register_callback(tool, monitoring.events.LINE, line)
    monitoring.set_events(tool, monitoring.events.LINE)
    try:
        for _ in range(n):
            next(it)
    finally:
        monitoring.set_events(tool, 0)
        monitoring.free_tool_id(tool)
    return lines[0] / n


def tree_env(tree: str) -> dict:
    """The environment of a child that imports ``tree``'s ``jaxloader``."""
    return {**os.environ, "PYTHONPATH": os.path.abspath(tree)}


def check_tree(tree: str, imported: str) -> None:
    """Raises unless the child imported ``tree``'s ``jaxloader`` (``imported``: its file)."""
    if not imported.startswith(os.path.join(os.path.abspath(tree), "jaxloader")):
        raise RuntimeError(f"{tree}: imported {imported}, not the tree's")


def count_lines(tree: str, case: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", case, "--count-lines"],
                         env=tree_env(tree), capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise RuntimeError(f"{tree}, {case}: the child failed:\n{out.stderr}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    check_tree(tree, found["jaxloader"])
    return found["lines"]


def receipt_cost() -> tuple[float, float]:
    """ns: (the lines a receipt runs for the timings, as ``WorkerPool._receive`` has them, their
    perf_counter one in 16 included; a timed receipt's calls and its timed hand-out's), each the
    median of 7 differences against the same loop without them."""
    import timeit
    from time import perf_counter

    from jaxloader.base.timings import SAMPLE, Gauges, weight

    class Message:
        timings = None

    class Pool:
        gauges = Gauges(2)

    def receipt(self: Pool, message: Message) -> bool:  # (pool.py's lines, copied)
        gauges = self.gauges
        received = gauges.receipts = gauges.receipts + 1
        began = perf_counter() if received <= SAMPLE or not received & (SAMPLE - 1) else 0.0
        if message.timings is not None:
            pass
        if began:
            pass
        return True

    def bare(self: Pool, message: Message) -> bool:
        return True

    entry, gauges = ("slot", "layout", [], None), Gauges(2)

    def timed() -> None:
        ready = {1: entry, 2: entry, 3: entry}
        began = perf_counter()
        gauges.received(weight(32), perf_counter() - began, ready)
        began = perf_counter()
        gauges.handed_out(perf_counter() - began, len(ready))

    def untimed() -> None:
        ready = {1: entry, 2: entry, 3: entry}  # (the same work but the timing)
        len(ready)

    pool, message = Pool(), Message()
    pool.gauges.receipts = SAMPLE  # (past the first SAMPLE: one in 16 timed)

    def ns(a, b, n: int) -> float:
        diffs = [(min(timeit.repeat(a, number=n, repeat=3)) -
                  min(timeit.repeat(b, number=n, repeat=3))) / n * 1e9 for _ in range(7)]
        return statistics.median(diffs)

    return (ns(lambda: receipt(pool, message), lambda: bare(pool, message), 200_000),
            ns(timed, untimed, 100_000))


class Turns:
    """A tree's child process for one case, answering chunks on request."""

    def __init__(self, tree: str, case: str) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", case],
                                     env=tree_env(tree), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        try:
            check_tree(tree, json.loads(self._line())["jaxloader"])
        except BaseException:
            self.close()
            raise

    def _line(self) -> str:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the child ended (exit code {self.proc.wait()})")
        return line

    def chunk(self, n: int) -> float:
        self.proc.stdin.write(f"{n}\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self._line())

    def close(self) -> None:
        """Ends the child: asked to, then killed if it has not ended within a minute."""
        try:
            self.proc.stdin.write("0\n")  # type: ignore[union-attr]
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def round_ratio(before: str, after: str, case: str, turns: int,
                after_first: bool) -> tuple[float, float, float]:
    """One round: (median after / before of the pairs, before's median us, after's). The
    process started first reads a few per cent faster or slower than the other (an after
    against itself shows it): the rounds take turns at starting first."""
    with contextlib.ExitStack() as stack:  # (each child ended, whatever fails)
        if after_first:
            b = stack.enter_context(contextlib.closing(Turns(after, case)))
            a = stack.enter_context(contextlib.closing(Turns(before, case)))
        else:
            a = stack.enter_context(contextlib.closing(Turns(before, case)))
            b = stack.enter_context(contextlib.closing(Turns(after, case)))
        n, ratios, us_a, us_b = CASES[case][4], [], [], []
        for i in range(turns):
            if i % 2 == 0:
                x = a.chunk(n)
                y = b.chunk(n)
            else:
                y = b.chunk(n)
                x = a.chunk(n)
            us_a.append(x)
            us_b.append(y)
            ratios.append(y / x)
    return statistics.median(ratios), statistics.median(us_a), statistics.median(us_b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", help="the tree to compare against (a checkout's root)")
    parser.add_argument("--after", action="append", help="a tree to measure (repeat it for "
                        "several, each against --before; default: this checkout)")
    parser.add_argument("--rounds", type=int, default=10, help="an even number: as many "
                        "rounds with each tree started first")
    parser.add_argument("--turns", type=int, default=20, help="pairs of chunks a round")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--control", action="store_true",
                        help="also the after tree against itself (the method's floor)")
    parser.add_argument("--count-lines", action="store_true", help="count the lines of Python "
                        "run a batch in each tree instead (3 runs each, Python 3.12 or newer)")
    parser.add_argument("--receipt-cost", action="store_true", help="time the lines a receipt "
                        "runs for the timings, and a timed receipt's calls (this tree)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.count_lines)
        return
    if args.receipt_cost:
        lines, timed = receipt_cost()
        print(f"a receipt's lines: {lines:.0f} ns; a timed receipt and its hand-out: "
              f"{timed:.0f} ns, {timed / 16:.0f} ns a receipt at one in 16")
        return
    if args.before is None:
        parser.error("--before: the tree to compare against is needed")
    cases, afters = args.cases.split(","), args.after or [os.path.dirname(HERE)]
    if args.count_lines:
        trees = [("before", args.before)] + [(a, a) for a in afters]
        print("| case | " + " | ".join(name for name, _ in trees) + " |")
        print("|---|" + "---|" * len(trees))
        for case in cases:
            counts = [sorted(count_lines(tree, case) for _ in range(3)) for _, tree in trees]
            print(f"| {case} | " + " | ".join(f"{c[1]:.1f} ({c[0]:.1f}-{c[2]:.1f})"
                                              for c in counts) + " |")
        return
    if args.rounds % 2:
        parser.error("--rounds: an even number, as many rounds with each tree started first")
    pairs = [(f"{a} / before", args.before, a) for a in afters]  # (paths: no two alike)
    if args.control:
        pairs.append(("after / after (control)", afters[0], afters[0]))
    results: dict = {}
    for r in range(args.rounds):
        for case in cases:
            for name, before, after in pairs:
                got = round_ratio(before, after, case, args.turns, after_first=r % 2 == 1)
                results.setdefault((case, name), []).append(got)
                print(f"round {r}: {case}, {name}: {got[0]:.3f} ({got[1]:.2f} -> {got[2]:.2f} us)",
                      file=sys.stderr, flush=True)
    print("| case | comparison | before, us | after, us | ratio (median of rounds) | rounds |")
    print("|---|---|---|---|---|---|")
    for case in cases:
        for name, _, _ in pairs:
            got = results[(case, name)]
            ratios = sorted(g[0] for g in got)
            print(f"| {case} | {name} | {statistics.median(g[1] for g in got):.2f} | "
                  f"{statistics.median(g[2] for g in got):.2f} | "
                  f"{statistics.median(ratios):.3f} | {ratios[0]:.3f}-{ratios[-1]:.3f} |")


if __name__ == "__main__":
    main()
