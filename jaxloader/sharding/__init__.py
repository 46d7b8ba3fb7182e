"""Device placement: the device-put thread and shardings, on one host or many."""

from jaxloader.sharding.prefetch import DevicePrefetcher

__all__ = ["DevicePrefetcher"]
