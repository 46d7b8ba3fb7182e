"""The Python blocks of the documentation's pages, run as a reader would run them.

Every fenced block whose info string is exactly ``python`` runs, in page order, in one namespace
a page (a later block uses what an earlier one defined), in a fresh empty working directory, in a
process of its own with JAX on 8 CPU devices. A block that cannot run here (a cluster, a TPU pod)
is written as a ``{code-block} python`` directive instead: shown, not run.

A ``text`` block that is the next block after a ``python`` one is what that block prints: its
printed output must match it, as a doctest's does (``...`` stands for any text: a pid, an
address, a path of this machine; white space is compared as one space). Output that is the
reader's machine's (timings) is written as a ``{code-block} text`` directive: shown, not
compared. The printed outputs had drifted from the code unseen while the blocks still ran.

``python tests/doc_blocks.py PAGE.md ...`` runs pages by hand; ``tests/test_docs.py`` runs them
all in the suite, so the docs cannot drift from the code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", re.M | re.S)

# Run in the page's own process: each block compiled under the page's name and line, so a
# failure's traceback points at the line of the page. A block with an output to match prints
# into a buffer, compared by doctest's checker (its ``...`` and white space rules: a familiar
# notation, where a mask of our own would hide what a reader cannot see).
_RUNNER = """
import doctest, io, sys
page, blocks = sys.argv[1], eval(sys.stdin.read())
namespace = {"__name__": "__main__"}
checker = doctest.OutputChecker()
flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.DONT_ACCEPT_TRUE_FOR_1
differ = []
for line, code, want in blocks:
    shown, printed = sys.stdout, io.StringIO()
    if want is not None:
        sys.stdout = printed
    try:
        exec(compile("\\n" * (line - 1) + code, page, "exec"), namespace)
    finally:
        sys.stdout = shown
        print(printed.getvalue(), end="")
    if want is not None and not checker.check_output(want, printed.getvalue(), flags):
        differ.append(f"{page}, the block at line {line}: its output differs from the text "
                      "block after it\\n" + checker.output_difference(
                          doctest.Example(code, want), printed.getvalue(), flags))
sys.exit("\\n".join(differ) or None)
"""


def blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """The page's runnable blocks: ``(line of the block's first code line, code, the output it
    prints: the text block after it, or None)``."""
    text = page.read_text()
    fences = [(m.group(1).strip(), text.count("\n", 0, m.start(2)) + 1, m.group(2))
              for m in _FENCE.finditer(text)]
    found = [(line, code, fences[i + 1][2] if fences[i + 1:] and fences[i + 1][0] == "text"
              else None) for i, (info, line, code) in enumerate(fences) if info == "python"]
    opened = len(re.findall(r"^```python[ \t]*$", text, re.M))  # (one inside a longer fence
    assert len(found) == opened, f"{page}: {opened} python blocks, {len(found)} found"  # hid it)
    return found


def run_page(page: Path, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """Runs ``page``'s blocks in a new process; returns it finished (``returncode`` 0: all ran)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="jaxloader-docs-") as cwd:
        return subprocess.run([sys.executable, "-c", _RUNNER, str(page)], cwd=cwd, env=env,
                              input=repr(blocks(page)), capture_output=True, text=True,
                              timeout=timeout_s)


def main(pages: list[str]) -> int:
    failed = 0
    for name in pages:
        page = Path(name).resolve()
        done = run_page(page)
        print(f"{name}: {len(blocks(page))} blocks, "
              f"{'ran' if done.returncode == 0 else 'FAILED'}")
        if done.returncode:
            failed += 1
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
