"""Run a snippet in a fresh interpreter with N CPU devices (JAX reads the count at start)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PRELUDE = """
import jax
jax.config.update("jax_num_cpu_devices", {n})
import numpy as np
import jaxloader as jl
from jax.sharding import NamedSharding, PartitionSpec as P

def reference(n, **kw):
    kw.setdefault("process_index", 0)
    kw.setdefault("process_count", 1)
    loader = jl.DataLoader(source(n), **kw)
    return [{{k: v.copy() for k, v in b.items()}} for b in loader]

def source(n):
    return jl.ArraySource({{"x": np.arange(n * 6, dtype=np.float32).reshape(n, 3, 2),
                           "y": np.arange(n, dtype=np.int32)}})

def noise(r, rng):
    return {{"x": r["x"] + rng.normal(size=r["x"].shape).astype(np.float32), "y": r["y"]}}
"""


def run_with_devices(code: str, n: int = 8, timeout: float = 120) -> str:
    script = PRELUDE.format(n=n) + textwrap.dedent(code)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout
