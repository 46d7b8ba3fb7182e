"""Starting several local processes (hosts joined by jax.distributed) for a test, and waiting."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def run_hosts(script: str, num_processes: int, args: list[str], timeout: float = 200,
              env: dict | None = None) -> list[str]:
    """BatchRuns ``script PROCESS_ID *args`` in each process (CPU backend); returns their stdouts.

    ``{port}`` in ``args`` becomes a free coordinator port shared by all the processes. Each
    must exit 0 and print ``done <process id>``.
    """
    port = str(free_port())
    env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    argv = [a.replace("{port}", port) for a in args]
    procs = [subprocess.Popen([sys.executable, script, str(i), *argv], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(num_processes)]
    outs = []
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0 and f"done {i}" in out, f"process {i}: {out}\n{err[-3000:]}"
        outs.append(out)
    return outs
