"""The loader configuration shared by the two-host run and its single-process reference."""

import numpy as np

import jaxloader as jl

RECORDS = 90


def noise(record, rng):
    return {"x": record["x"] + rng.normal(size=3).astype(np.float32), "y": record["y"]}


def make_loader(**kw):
    source = jl.ArraySource({"x": np.arange(RECORDS * 3, dtype=np.float32).reshape(-1, 3),
                             "y": np.arange(RECORDS, dtype=np.int32)})
    return jl.DataLoader(source, shuffle=True, seed=11, transforms=[jl.RandomMap(noise)],
                         num_epochs=None, last_batch="pad", **kw)
