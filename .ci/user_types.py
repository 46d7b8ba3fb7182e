"""A user's script, outside the tree, type-checked against the package as README installs it
(`pip install -e .`): mypy must find jaxloader (its editable install is a path in a .pth file,
which type checkers read, not an import hook, which they cannot) and flag a PyTorch argument
that the DataLoader does not take. Run by .ci/run after mypy, with its options and cache (a
package mypy cannot find would be Any there, and nothing flagged)."""

import os
import subprocess
import sys
import tempfile

USER_SCRIPT = """\
import numpy as np
import jaxloader as jl

loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, drop_last=True)
plain = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2)
doubled = [batch["x"] * 2 for batch in plain]  # a batch is Any unless the code says which
typed: jl.DataLoader[dict[str, np.ndarray]] = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}),
                                                            batch_size=2)
count: int = next(iter(typed))
"""

cache, config = os.path.abspath(".mypy_cache"), os.path.abspath("pyproject.toml")
with tempfile.TemporaryDirectory() as cwd:
    with open(os.path.join(cwd, "train.py"), "w") as f:
        f.write(USER_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache, "--config-file",
                           config, "train.py"],
                          cwd=cwd, capture_output=True, text=True)
print(done.stdout, end="")
expected = ['train.py:4: error: Argument "drop_last" to "DataLoader"',
            'train.py:9: error: Incompatible types in assignment (expression has type '
            '"dict[str, ndarray']
errors = [line for line in done.stdout.splitlines() if ": error:" in line]
if len(errors) != 2 or not all(any(e.startswith(x) for e in errors) for x in expected):
    print(f"user_types: expected mypy to see jaxloader and flag exactly {expected}",
          file=sys.stderr)
    sys.exit(1)
print("user_types: a user's script sees jaxloader's types (drop_last=True flagged, a typed "
      "loader's batch checked)")
