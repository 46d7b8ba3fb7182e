"""Worker processes over a shared-memory slot ring (see ``pool.py`` for the data flow)."""

from jaxloader.runtime.worker_info import WorkerInfo, get_worker_info

__all__ = ["WorkerInfo", "get_worker_info"]
