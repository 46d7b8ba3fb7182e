"""A stand-in for Google Cloud Storage: ``gs://bucket/key`` served from a local folder.

Registered as fsspec's ``gs``/``gcs`` filesystem, the one ``etils.epath`` opens ``gs://`` paths
with when TensorFlow is not installed: the sources take the same code path as on a real bucket,
with no network. ``register(root)`` in the test process, and as ``worker_init_fn`` in workers
(fresh interpreters: they do not inherit the registration).
"""

from __future__ import annotations

import os

import fsspec
from fsspec.implementations.local import LocalFileSystem


class FakeGcs(LocalFileSystem):
    protocol = ("gs", "gcs")
    root = ""
    opened: list[str] = []  # every path opened through this filesystem, in this process

    def __init__(self, **kwargs):  # epath passes finalize_on_close=True, as to gcsfs
        kwargs.pop("finalize_on_close", None)
        super().__init__(**kwargs)

    @classmethod
    def _strip_protocol(cls, path):
        path = os.fspath(path)
        for prefix in ("gs://", "gcs://"):
            if path.startswith(prefix):
                return os.path.join(cls.root, path[len(prefix):])
        return super()._strip_protocol(path)

    def _open(self, path, mode="rb", **kwargs):
        FakeGcs.opened.append(path)
        return super()._open(path, mode, **kwargs)


def connection_reset(self, path, mode="rb", **kwargs):
    """An ``_open`` for ``monkeypatch.setattr(FakeGcs, "_open", ...)``: the network fails."""
    raise ConnectionResetError(104, "Connection reset by peer")


def register(root: str, worker_id: int | None = None) -> None:
    """Serve ``gs://`` from ``root`` in this process (``worker_init_fn`` passes the id)."""
    FakeGcs.root = str(root)
    FakeGcs.opened = []
    for name in FakeGcs.protocol:
        fsspec.register_implementation(name, FakeGcs, clobber=True)
    from etils.epath import backend

    backend.fsspec_backend._get_filesystem.cache_clear()  # a filesystem cached before


def unregister() -> None:
    """Back to fsspec's own ``gs``/``gcs`` (gcsfs, where installed)."""
    from fsspec.registry import _registry
    from etils.epath import backend

    for name in FakeGcs.protocol:
        _registry.pop(name, None)
    backend.fsspec_backend._get_filesystem.cache_clear()
