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
"""

cache, config = os.path.abspath(".mypy_cache"), os.path.abspath("pyproject.toml")
with tempfile.TemporaryDirectory() as cwd:
    with open(os.path.join(cwd, "train.py"), "w") as f:
        f.write(USER_SCRIPT)
    done = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache, "--config-file", config,
                           "train.py"],
                          cwd=cwd, capture_output=True, text=True)
print(done.stdout, end="")
if done.returncode != 1 or 'Argument "drop_last" to "DataLoader"' not in done.stdout or \
        "import-not-found" in done.stdout:
    print("user_types: expected mypy to see jaxloader and flag drop_last=True only", file=sys.stderr)
    sys.exit(1)
print("user_types: a user's script sees jaxloader's types (drop_last=True flagged)")
