"""A checkout of 767d742 with the stage timings cut from the training process's path: the tree
``bench_overhead.py`` compares against to measure what the timings cost there (issue 46). Between
it and the tree measured: the timings, how they are sampled, and one test of ``next()`` older
than them (whether a batch was handed out before), which the tree measured folds into the
check the timings brought (one test a call where the untimed tree has one too).

    python benchmarks/strip_timings.py /tmp/untimed   # then:
    python benchmarks/bench_overhead.py --before /tmp/untimed

Cut: the pool's hand-over timing (one batch in 16), its timed receipts and its adding up of the
workers' timings; the workers' sending of them (a ``Done`` carries none); ``next()``'s test of
its first batch and of the monitor's time. Kept: what the workers time for themselves (their
own CPU, not the training process's) and the consumer's wait and step, which came before the
timings. 767d742 is the last commit before the training process's path was changed to cost
less; each cut asserts that its text is found, so the script cannot silently cut nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

COMMIT = "767d742"
CUTS = [  # (file, text, replacement)
    ("jaxloader/workers/pool.py", """\
                    if next_yield & (SAMPLE - 1):  # (SAMPLE: a power of two)
                        handed = [self._ring.hand_out(*made[:3])]
                    else:
                        began = perf_counter()
                        handed = [self._ring.hand_out(*made[:3])]
                        self.gauges.main.add(HANDOVER, SAMPLE * (perf_counter() - began))
                        self.gauges.ready += SAMPLE * len(ready)
                        self.gauges.handed += SAMPLE
""", """\
                    handed = [self._ring.hand_out(*made[:3])]
"""),
    ("jaxloader/workers/pool.py", """\
        self._receives += 1  # (the hand-over's sample: its reads too)
        began = perf_counter() if not self._receives & (SAMPLE - 1) else 0.0
""", ""),
    ("jaxloader/workers/pool.py", """\
                if message.timings is not None:
                    self.gauges.makers[worker].absorb(message.timings)
""", ""),
    ("jaxloader/workers/pool.py", """\
        if began:
            self.gauges.main.add(HANDOVER, SAMPLE * (perf_counter() - began))
        return True
""", """\
        return True
"""),
    ("jaxloader/workers/worker.py", """\
        if now >= send_at or trace or failed is not None:
""", """\
        if False:  # (cut: no timings sent)
"""),
    ("jaxloader/loaders/iterator.py", """\
            if returned >= progress.check_at:  # the first batch, or the monitor's time
                self._checks(progress, entered, returned)
""", ""),
]


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(["git", "-C", repo, "worktree", "add", "--detach", out, COMMIT], check=True)
    for path, text, replacement in CUTS:
        full = os.path.join(out, path)
        with open(full, encoding="utf-8") as f:
            source = f.read()
        if source.count(text) != 1:
            sys.exit(f"{path}: the text to cut is found {source.count(text)} times, not once:\n"
                     f"{text}")
        with open(full, "w", encoding="utf-8") as f:
            f.write(source.replace(text, replacement))
    print(f"{out}: {COMMIT} without the training process's timings; remove it with "
          f"git worktree remove --force {out}")


if __name__ == "__main__":
    main()
