"""One host of a two-host run comparing the hosts' loaders (started by test_hosts.py).

Usage: hosts_run.py PROCESS_ID PORT

Makes, on both hosts, loaders alike and loaders that differ on host 1 (its seed, its batch
size, the step it restored, its data, its files, a stream's seed, num_epochs or shuffle; both hosts
given process_index=0), one iter() each
in the same order (host 0 also profiles a loader first, alone), and prints what each did:
"CASE ok" with its first batches' ids, or "CASE refused: <message>", and "CASE_warned
<message>" for each warning. Last, host 0 alone iterates one more loader, and prints what it
logged waiting for host 1.
"""

import logging
import os
import sys
import tempfile
import time
import warnings

import jax

process_id, port = int(sys.argv[1]), sys.argv[2]
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                           process_id=process_id)

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

import jaxloader as jl  # noqa: E402

logged = []
handler = logging.Handler()
handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
logging.getLogger("jaxloader").addHandler(handler)
source = jl.ArraySource({"id": np.arange(80)})
other = process_id == 1


def loader(**kw):
    return jl.DataLoader(source, **{"batch_size": 4, "shuffle": True, "seed": 3, **kw})


def run(case, made, steps=3):
    with made, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        try:
            it = iter(made)
            ids = [next(it)["id"].tolist() for _ in range(steps)]
            print(f"{case} ok {ids}", flush=True)
        except jl.ConfigError as e:
            print(f"{case} refused: {e}", flush=True)
    for w in warned:
        print(f"{case}_warned {w.message}", flush=True)


run("alike", loader())
run("seed", loader(seed=4 if other else 3))
run("batch_size", loader(batch_size=8 if other else 4))
restored = loader()
if other:  # (a state by hand: a loader iterated on this host alone would be out of step)
    restored.load_state_dict({**restored.state_dict(), "step": 2})
run("step", restored)
run("mask_key", loader(last_batch="pad", mask_key="valid" if other else "mask"))
run("mask_key_unused", loader(mask_key="valid" if other else "mask"))  # (no mask: warned)
if other:
    time.sleep(1.5)  # host 0's first next() waits for this host's settings
run("late", loader(), steps=8)
run("data", jl.DataLoader(jl.ArraySource({"id": np.arange(80) + other}), batch_size=4))
own = os.path.join(tempfile.mkdtemp(), "part.parquet")  # (each host a file of its own rows)
pq.write_table(pa.table({"id": np.arange(80) + 1000 * process_id}), own)
run("files", jl.DataLoader(jl.ParquetSource(own), batch_size=4))
run("index", loader(process_index=0, process_count=2))  # (host 1's too: the same rows)
run("stream_index", jl.StreamLoader(jl.Stream.from_generator(
    lambda shard: iter([{"id": shard}] * 4), 8), batch_size=2, process_index=0, process_count=2))
lines = jl.Stream.from_generator(lambda shard: ({"id": shard * 10 + i} for i in range(10)), 4)
run("stream", jl.StreamLoader(lines, batch_size=2))
run("stream_seed", jl.StreamLoader(lines, batch_size=2, seed=5 if other else 0))
run("stream_epochs", jl.StreamLoader(lines, batch_size=2, num_epochs=None if other else 1))
with jl.StreamLoader(lines, batch_size=2, num_epochs=1) as first:  # a state in mid-pass
    it = iter(first)
    next(it)
    mid_pass = first.state_dict()
restored = jl.StreamLoader(lines, batch_size=2, num_epochs=None if other else 1)
restored.load_state_dict(mid_pass)  # (host 0 asks the others at iter() whether it ended)
run("stream_epochs_restored", restored)
shuffled = jl.Stream.from_generator(lambda shard: iter([{"id": shard}] * 4), 8,
                                    shuffle_shards=not other)
run("stream_shuffle", jl.StreamLoader(shuffled, batch_size=2))
profiled = loader(num_epochs=None)
if not other:  # (a profile on one process alone puts the position back: not compared)
    jl.profile(profiled, steps=3, out=None)
run("profiled", profiled)
profiled_pass = jl.StreamLoader(lines, batch_size=2, num_epochs=1)
if not other:  # (whether its pass ended was asked of every process, which never joined: hung)
    jl.profile(profiled_pass, steps=3, out=None)
run("profiled_pass", profiled_pass)
assert not logged, logged  # (nothing waited for so far)
if not other:
    from jaxloader.sharding import hosts

    hosts.WAIT_S = 0.5
    run("missing", loader())
    print("logged:", *logged, flush=True)
print("done", process_id)
