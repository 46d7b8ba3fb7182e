"""What a user's type checker sees of the public API: CI's mypy checks this file (pyproject's
``[tool.mypy] files``), so documented usage that it would refuse fails CI, and each mistake
below must stay an error (``warn_unused_ignores``: an ignore with no error is one). Never run:
everything is inside a function no one calls."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import jaxloader as jl


class Digits:
    """A PyTorch-style dataset: its own name for the index."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, idx: int) -> dict[str, int]:
        return {"x": idx}


def _usage() -> None:
    web = jl.ArraySource({"x": np.arange(10)})
    code = jl.ArraySource({"x": np.arange(10)})
    mixed: jl.Mixture = jl.mix([web, code], [0.7, 0.3])  # (a source: a DataLoader's)
    jl.DataLoader(jl.mix({"web": web, "code": code}, np.array([0.7, 0.3])), batch_size=8)
    jl.DataLoader(mixed, batch_size=np.int64(4), seed=np.uint64(7), shuffle=np.bool_(True),
                  transforms=lambda r: r, worker_init_fn=lambda worker: 3, last_batch="pad")
    jl.DataLoader(Digits(), batch_size=2, transforms=jl.Map(lambda r: r))
    jl.DataLoader([{"x": 1}, {"x": 2}], batch_size=2, transforms=None)
    streams = jl.mix([jl.Stream.jsonl("a.jsonl"), jl.Stream.jsonl("b.jsonl")], [1, 1])
    with jl.StreamLoader(streams, batch_size=2, transforms=jl.Filter(bool)) as loader:
        loader.state_dict()
    jl.profile(loader, out=Path("profile.png"))
    n = np.int64(4)  # (NumPy ints where counts go, as the getting-started page says)
    jl.DataLoader(web, batch_size=2, shuffle=jl.LocalShuffle(window=n, block_size=n),
                  transforms=[jl.Pad("x", multiple_of=n), jl.Pad("x", length={"x": n})])
    jl.PackedSource(web, "x", n, bins=n, window=n)
    lengths: dict[str, int] = {"x": 8}  # (a dict of ints: a Mapping of counts, not invariant)
    jl.Pad("x", length=lengths, multiple_of=lengths)
    jl.PackedStream(jl.Stream.jsonl("a.jsonl"), "t", n, method="best_fit", bins=n, window=n)
    jl.ParquetSource("a.parquet", cache_bytes=np.int64(64 << 20))
    jl.profile(loader, steps=n, workers=[n, 0])
    jl.Stream.from_generator(lambda i: iter([{"x": i}]), shards=n, shuffle_window=n)
    jl.JitMap(lambda r: r, chunk_bytes=n)
    jl.FilteredSource(web, indices=[1, 2, 3], num_workers=n)  # (PyTorch's Subset(ds, indices))
    jl.FileListSource(["a.jpg"], labels=np.array([1]))
    jl.checkpoint.LoaderSave
    jl.DataLoder(web, batch_size=2)  # type: ignore[attr-defined]
    jl.DataLoader(web, batch_size=2, last_batch="partal")  # type: ignore[arg-type]
    jl.DataLoader(web, batch_size=2, start_method="spawn")  # type: ignore[arg-type]
    jl.StreamLoader(jl.mix([web, code], [1, 1]), batch_size=2)  # type: ignore[arg-type]
    parts = [jl.ParquetSource("a.parquet"), jl.ArraySource({"x": np.arange(10)})]  # (several
    jl.DataLoader(jl.mix(parts, [0.5, 0.5]), batch_size=2)  # kinds: a list[Source], not of
    jl.DataLoader(jl.ConcatSource(parts), batch_size=2)  # object: the typing audit)
    jl.Stream.jsonl("a.jsonl", shuffle_windw=4)  # type: ignore[arg-type]
    jl.Stream.from_generator(lambda i: iter([i]), 2, shuffle_window="big")  # type: ignore[arg-type]
    with jl.DataLoader(web, batch_size=2) as plain:  # (refused at run time: not there at all)
        plain.sampler  # type: ignore[attr-defined]
        plain.drop_last  # type: ignore[attr-defined]
    len(loader)  # type: ignore[arg-type]
    jl.DataLoader(web, batch_size=2, transforms=[jl.Map(lambda r: r), 2])  # type: ignore[list-item]
    jl.DataLoader(web, batch_size=2, transforms=[lambda r: r, jl.Pad("x")])
    jl.JitMap(lambda r, key: r)
