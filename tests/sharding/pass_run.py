"""One host of a two-host pass over a stream (started by test_stream_passes.py).

Usage: pass_run.py PROCESS_ID PORT OUT_DIR PASSES
       [packed | mixed | first_exhausted | resume | fails]

Each host reads its own readers' shards (uneven: host 1's end far later than host 0's) with
``num_epochs=1`` and runs a collective every step, as a training or evaluation step would; a
host that stopped before the other would leave it waiting there. Writes each pass's records
(``packed``: the records packed into rows of 8 tokens, record ``i`` being ``1 + i % 5``
tokens ``i + 1``; each placed token's record is written; ``mixed``: mixed at 0.75 / 0.25 with
a second stream, ``1000 + i``, of 2, 6, 1 and 9 records a shard; ``first_exhausted``: so
mixed, with that stopping strategy; ``resume``: a pass, then the same pass left at step 24,
where host 0's readers are done and host 1's are not, continued by a new ``iter()``, by a
state restored into a new loader, and looked at with ``peek()`` there; ``fails``: host 1's
record 70 raises in a ``Map``, and each host writes what its loop raised).
"""

import json
import sys

import jax

process_id, port, out_dir, passes = sys.argv[1:5]
packed, first = sys.argv[5:] == ["packed"], sys.argv[5:] == ["first_exhausted"]
resume, fails = sys.argv[5:] == ["resume"], sys.argv[5:] == ["fails"]
mixed = first or sys.argv[5:] == ["mixed"]
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                           process_id=int(process_id))

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import jaxloader as jl  # noqa: E402

SIZES = [5, 40, 3, 60]  # readers 0, 1 on host 0; 2, 3 on host 1 (no shard shuffle)
STARTS = np.cumsum([0, *SIZES])
stream = jl.Stream.from_generator(
    lambda s: ({"id": i} for i in range(STARTS[s], STARTS[s] + SIZES[s])), len(SIZES),
    shuffle_shards=False, shuffle_window=4)
if mixed:
    SMALL = np.cumsum([0, 2, 6, 1, 9])
    small = jl.Stream.from_generator(
        lambda s: ({"id": 1000 + i} for i in range(SMALL[s], SMALL[s + 1])), 4,
        shuffle_shards=False, shuffle_window=2)
    stream = jl.mix([stream, small], [0.75, 0.25], stopping_strategy=(
        "first_exhausted" if first else "all_exhausted_without_replacement"))
if packed:
    stream = jl.PackedStream(stream, "t", 8,
                             tokenize=lambda r: {"t": np.full(1 + r["id"] % 5, r["id"] + 1)})


def ids_of(batches):
    return [batch["id"][batch["mask"]].tolist() for batch in batches]


if resume:
    def loader_of():
        return jl.StreamLoader(stream, batch_size=4, num_epochs=1, num_workers=0,
                               readers_per_process=2)
    with loader_of() as loader:
        full = ids_of(loader)
    with loader_of() as loader:
        it = iter(loader)
        ids_of(next(it) for _ in range(24))
        state, peeked = loader.state_dict(), ids_of([loader.peek()])
        again = ids_of(loader)  # a new iter(): the rest of the pass
    with loader_of() as loader:
        loader.load_state_dict(state)
        restored_peek = ids_of([loader.peek()])
        restored = ids_of(loader)
    with open(f"{out_dir}/pass_{process_id}.json", "w") as f:
        json.dump({"full": full, "again": again, "restored": restored, "peeked": peeked,
                   "restored_peek": restored_peek}, f)
    print("done", process_id)
    sys.exit(0)
if fails:
    def damaged(record):
        if record["id"] == 70:  # (host 1's reader 3)
            raise ValueError("record 70 is damaged")
        return record

    with jl.StreamLoader(stream, batch_size=4, num_epochs=1, transforms=[jl.Map(damaged)],
                         readers_per_process=2) as loader:
        try:
            said = f"finished after {len(list(loader))} steps"
        except Exception as e:  # (host 0 waited for host 1 in the pass's end for good)
            said = f"{type(e).__name__}: {e}"
    with open(f"{out_dir}/pass_{process_id}.json", "w") as f:
        json.dump(said, f)
    print("done", process_id)
    sys.exit(0)
out = []
with jl.StreamLoader(stream, batch_size=4, num_epochs=1, num_workers=2) as loader:
    assert loader.process_count == 2
    for _ in range(int(passes)):
        steps, ids = 0, []
        for batch in loader:
            total = multihost_utils.process_allgather(batch["mask"].sum())  # the collective
            steps += 1
            if packed:
                tokens = batch["t"][batch["mask"]]
                ids += (tokens[tokens > 0] - 1).tolist()
            else:
                ids += batch["id"][batch["mask"]].tolist()
            assert total.shape == (2,)
        out.append({"steps": steps, "ids": ids})
with open(f"{out_dir}/pass_{process_id}.json", "w") as f:
    json.dump(out, f)
print("done", process_id)
