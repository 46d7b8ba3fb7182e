"""What makes the batches of a run of steps, in order: the engine protocol and the engine that
runs in the calling thread (``in_process``). Worker processes are ``jaxloader.workers``, device
placement ``jaxloader.sharding``: the same layer.
"""
