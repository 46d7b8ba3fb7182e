"""PackedSource: rows with segment ids and positions; through the loader, exact and elastic."""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest

import jaxloader as jl
from resume_harness import check_resume, check_split_resume, take

WIDTH = 16


def documents(n=200, seed=0):
    """Records whose tokens are globally unique ids (1..): where each token went is checkable."""
    lengths = np.random.default_rng(seed).integers(0, 40, n)
    ends = np.cumsum(lengths)
    tokens = np.arange(1, ends[-1] + 1, dtype=np.int32)
    return jl.RaggedSource({"tokens": (tokens, np.concatenate([[0], ends]))}), lengths


def unpack(batch, key="tokens"):
    """Each segment of each row: (segment id, tokens), checking ids and positions on the way."""
    segments = []
    for tokens, ids, positions in zip(batch[key], batch[f"{key}_segment_ids"],
                                      batch[f"{key}_positions"]):
        assert np.all(tokens[ids == 0] == 0) and np.all(positions[ids == 0] == 0)
        used = ids[ids > 0]
        assert np.array_equal(np.unique(used), np.arange(1, len(np.unique(used)) + 1))
        assert np.all(np.diff(used) >= 0), "segment ids count up along the row"
        for s in np.unique(used):
            at = ids == s
            assert np.array_equal(positions[at], np.arange(at.sum()))
            segments.append(tokens[at])
    return segments


@pytest.mark.parametrize("method", ["concat", "first_fit", "best_fit"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_holds_every_token_exactly_once(method, num_workers):
    source, lengths = documents()
    packed = jl.PackedSource(source, "tokens", WIDTH, method=method, bins=3, window=50)
    with jl.DataLoader(packed, batch_size=4, shuffle=True, seed=1, last_batch="pad",
                       num_workers=num_workers, process_index=0, process_count=1) as loader:
        for epoch in range(2):
            seen = []
            for batch in loader:
                real = {k: v[batch["mask"]] for k, v in batch.items() if k != "mask"}
                seen += unpack(real)
            got = np.sort(np.concatenate(seen))
            assert np.array_equal(got, np.arange(1, lengths.sum() + 1)), epoch
            if method != "concat":  # whole records: each segment is a record or a row-sized piece
                assert all(len(s) <= WIDTH and np.all(np.diff(s) == 1) for s in seen)


def test_a_truncating_packer_reports_what_it_cut():
    source, lengths = documents()
    packed = jl.PackedSource(source, "tokens", WIDTH, overlong="truncate")
    assert packed.truncated.tolist() == np.flatnonzero(lengths > WIDTH).tolist()
    seen = unpack(packed.__getitems__(np.arange(len(packed))))
    assert sum(len(s) for s in seen) == np.minimum(lengths, WIDTH).sum()
    starts = np.concatenate([[1], np.cumsum(lengths)[:-1] + 1])
    assert sorted(int(s[0]) for s in seen) == starts[lengths > 0].tolist()  # each record's head


def test_sequences_of_several_axes_are_refused_not_flattened():
    # from_sequences flattened a (T, 4) episode into 4T values: a window cut from it mixed
    # features and steps, and lengths counted values, silently (the RL and graph audits)
    episodes = [np.arange(12.0).reshape(3, 4), np.arange(8.0).reshape(2, 4)]
    with pytest.raises(jl.ConfigError, match=r"'obs' of sequence 0 has shape \(3, 4\), "
                                             r"expected 1-D.*its own key.*jl.Pad"):
        jl.RaggedSource.from_sequences({"obs": episodes})
    with pytest.raises(jl.ConfigError, match=r"got shape \(5, 4\) .*its own key"):
        jl.RaggedSource({"obs": (np.concatenate(episodes), np.array([0, 3, 5]))})
    ones = jl.RaggedSource.from_sequences({"t": [7, [8, 9], [[5, 6, 7]], [[4], [3]]]})
    assert ones.lengths("t").tolist() == [1, 2, 3, 2] and ones[2]["t"].tolist() == [5, 6, 7]
    # (a scalar, a tokenizer's (1, T) ids and (T, 1) values have one axis of values)


def test_a_dtype_that_does_not_hold_the_sequences_values_is_refused_naming_them():
    # np.asarray(s, dtype) wrapped node ids past 2**31 into others, cut 1.7 to 1 and made
    # 100000.0 inf in float16, silently (the graph audit); a Pad(dtype=) refused them
    for values, dtype, said in [([1, 2**40], np.int32, "values"), ([0.5, 1.7], np.int32,
                                                                    "kind"),
                                ([100000.0], np.float16, "values"), ([-1, 300], np.uint8,
                                                                     "values")]:
        with pytest.raises(jl.ConfigError, match=r"from_sequences: 'ids' of sequence 1 .*"
                                                 + ("holds values" if said == "values" else
                                                    "would change in kind")):
            jl.RaggedSource.from_sequences({"ids": [[3], values]}, dtype=dtype)
    kept = jl.RaggedSource.from_sequences({"ids": [[3], [2**31 - 1, -7]]}, dtype=np.int32)
    assert kept[1]["ids"].tolist() == [2**31 - 1, -7] and kept[1]["ids"].dtype == np.int32
    rounded = jl.RaggedSource.from_sequences({"x": [[0.1]]}, dtype=np.float32)  # (rounds)
    assert rounded[0]["x"].dtype == np.float32


def test_sequences_of_python_objects_or_of_other_dtypes_are_refused_where_values_change():
    # (the sources audit) dtype= cast None to NaN or False and failed on 2**70 with a bare
    # OverflowError; without dtype=, sequences of other dtypes took NumPy's common one: an id
    # past 2**53 beside a float rounded, a uint64 past 2**63 beside int64s made float64
    for values, dtype, said in [([1.5, None], np.float32, r"None at position 1 \(None, which "
                                 r"dtype=float32 has no value for\)"),
                                ([True, None], np.bool_, "None at position 1"),
                                ([1, 2**70], np.int64, r"1180591620717411303424 at position 1 "
                                 r"\(OverflowError"),
                                ([1.7, 2**70 + 1], np.float64,
                                 r"1180591620717411303425 at position 1 \(made "
                                 r"1.1805916207174113e\+21\)")]:
        with pytest.raises(jl.ConfigError, match=r"from_sequences: 'ids' of sequence 1 holds "
                                                 + said + ".*pass a dtype that holds them"):
            jl.RaggedSource.from_sequences({"ids": [[values[0]], values]}, dtype=dtype)
    for sequences, kinds in [([[2**53 + 1], [0.5]], "'float64', 'int64'"),
                             ([np.array([2**63 + 1], np.uint64), np.array([-1])],
                              "'int64', 'uint64'"), ([[True, False], [2]], "'bool', 'int64'")]:
        with pytest.raises(jl.ConfigError, match=rf"the sequences of 'ids' are of dtypes "
                                                 rf"\[{kinds}\], which NumPy makes one .*make "
                                                 r"them one dtype, or pass dtype="):
            jl.RaggedSource.from_sequences({"ids": sequences})
    with pytest.raises(jl.ConfigError, match=r"holds 1e\+300 at position 1 \(made inf\)"):
        jl.RaggedSource.from_sequences({"x": [[2**70, 1e300]]}, dtype=np.float32)
    words = jl.RaggedSource.from_sequences({"w": [["ab", "c"], ["defg"]]})  # (widened: kept)
    assert words[1]["w"].tolist() == ["defg"] and words[0]["w"].dtype == np.dtype("<U4")
    mixed = jl.RaggedSource.from_sequences({"x": [[1, 2], [0.5]]})  # (kept: ints in float64)
    assert mixed[0]["x"].tolist() == [1.0, 2.0] and mixed[1]["x"].dtype == np.float64
    nan = jl.RaggedSource.from_sequences({"x": [[1, float("nan"), 2**60]]}, dtype=np.float32)
    assert np.isnan(nan[0]["x"][1]) and nan[0]["x"][2] == 2.0**60


def test_a_key_empty_in_every_sequence_keeps_its_arrays_dtype():
    # (the packing audit) it became int64, and the rows packed from it with it
    ragged = jl.RaggedSource.from_sequences({"a": [np.zeros(0, np.int32)],
                                             "b": [np.array([1], np.int32)]})
    assert ragged[0]["a"].dtype == np.int32
    row = jl.PackedSource(ragged, ["a", "b"], 2)[0]
    assert (row["a"].dtype, row["b"].dtype) == (np.int32, np.int32)
    assert jl.RaggedSource.from_sequences({"a": [[]]})[0]["a"].dtype == np.int64  # (a list's)


def test_any_source_of_dict_records_packs_like_a_ragged_one():
    source, _ = documents(60)
    records = [{"tokens": np.array(source[i]["tokens"]), "label": i} for i in range(len(source))]
    as_list = jl.PackedSource(records, "tokens", WIDTH, method="best_fit")
    ragged = jl.PackedSource(source, "tokens", WIDTH, method="best_fit")
    rows = np.arange(len(ragged))[::-1]
    a, b = as_list.__getitems__(rows), ragged.__getitems__(rows)
    assert a.keys() == b.keys() == {"tokens", "tokens_segment_ids", "tokens_positions"}
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert np.array_equal(ragged[3]["tokens"], b["tokens"][len(rows) - 4])


def test_several_keys_are_packed_side_by_side():
    inputs = [np.arange(n) + 1 for n in (5, 3, 7, 2)]
    targets = [np.full(n, 9) for n in (2, 4, 1, 3)]
    source = jl.RaggedSource.from_sequences({"inputs": inputs, "targets": targets})
    packed = jl.PackedSource(source, ["inputs", "targets"], {"inputs": 10, "targets": 6},
                             seed=None)
    batch = packed.__getitems__(np.arange(len(packed)))
    assert batch["inputs"].shape[1] == 10 and batch["targets"].shape[1] == 6
    for row in range(len(packed)):  # a record's inputs and targets share a segment id
        ids_in, ids_tg = batch["inputs_segment_ids"][row], batch["targets_segment_ids"][row]
        assert set(np.unique(ids_in)) - {0} == set(np.unique(ids_tg)) - {0}
    assert sorted(map(len, unpack(batch, "inputs"))) == [2, 3, 5, 7]


def test_each_key_pads_with_its_value_and_float_keys_pack_from_any_source():
    # the rows were 0 after their segments whatever the key: an SFT's labels padded with 0
    # trained the model to predict token 0 on every padding slot, silently; and a float key
    # (a weight a token) packed from a RaggedSource only (the SFT and DPO audits)
    ids = [np.arange(1, n + 1, dtype=np.int32) for n in (5, 3, 7, 2)]
    records = [{"ids": i, "labels": np.where(i > 2, i, -100).astype(np.int32),
                "weight": (i > 2).astype(np.float32)} for i in ids]
    value = {"ids": 0, "labels": -100, "weight": 0.0}
    for source in (records, jl.RaggedSource.from_sequences(
            {k: [r[k] for r in records] for k in ("ids", "labels", "weight")})):
        packed = jl.PackedSource(source, ["ids", "labels", "weight"], 8, seed=None, value=value)
        batch = packed.__getitems__(np.arange(len(packed)))
        pad = batch["ids_segment_ids"] == 0
        assert pad.any() and (batch["labels"][pad] == -100).all() and (batch["ids"][pad] == 0).all()
        assert batch["weight"].dtype == np.float32 and (batch["weight"][pad] == 0).all()
        placed = ~pad
        assert np.array_equal(batch["labels"][placed] == -100, batch["weight"][placed] == 0)
    with pytest.raises(jl.ConfigError, match=r"value=...\): expected a number .*, or a dict of "
                                             r"one for each key of \['ids', 'labels'\]"):
        jl.PackedSource(records, ["ids", "labels"], 8, value={"labels": -100})
    unsigned = [{"ids": r["ids"].astype(np.uint16)} for r in records]
    with pytest.raises(jl.ConfigError, match=r"'ids' holds uint16, which cannot hold value=-1"):
        jl.PackedSource(unsigned, "ids", 8, value=-1)[0]
    with pytest.raises(jl.ConfigError, match=r"record 0\['t'\]: expected a 1-D array of "
                                             r"numbers.*<U1 \(text: tokenize it first"):
        jl.PackedSource([{"t": np.array(list("abc"))}], "t", 8)


def test_keys_as_long_as_the_tokens_left_out_of_the_rows_are_said_once(recwarn):
    # labels or a loss mask beside the tokens were dropped from the rows without a word (a
    # PackedStream said so): the loss then counted every token
    ragged = jl.RaggedSource.from_sequences({
        "tokens": [[1, 2, 3], [4, 5], [6, 7, 8, 9]], "labels": [[2, 3, 0], [5, 0], [7, 8, 9, 0]],
        "attention_mask": [[1, 1, 1], [1, 1], [1, 1, 1, 1]]})  # (all 1s: not a key to pack)
    dicts = [{"tokens": np.arange(4), "loss_mask": np.array([0, 0, 1, 1]), "id": i}
             for i in range(3)]
    for source, left, keys in ((ragged, ["labels"], ["tokens", "labels"]),
                               (dicts, ["loss_mask"], ["tokens", "loss_mask"])):
        with pytest.warns(jl.JaxloaderWarning, match=re.escape(
                f"PackedSource: the records hold {left} as long as 'tokens', which are not "
                f"packed and left out of the rows; to pack them at the same places, pass "
                f"keys={keys}")):  # (a RaggedSource's said as made, others' at a first read)
            jl.PackedSource(source, "tokens", 8)[0]
        recwarn.clear()
        jl.PackedSource(source, keys, 8)[0]  # (packed: nothing to say)
        assert not [w for w in recwarn if issubclass(w.category, jl.JaxloaderWarning)]
    with jl.DataLoader(jl.PackedSource(dicts, "tokens", 8), batch_size=1, num_workers=1,
                       process_index=0, process_count=1) as loader:  # (from a worker: said)
        with pytest.warns(jl.JaxloaderWarning, match=r"hold \['loss_mask'\] as long as"):
            next(iter(loader))


def test_lengths_are_read_once_and_kept_next_to_the_data(tmp_path):
    source, lengths = documents(50)
    records = [{"tokens": np.array(source[i]["tokens"])} for i in range(len(source))]
    cache = tmp_path / "train.lengths.npy"
    first = jl.PackedSource(records, "tokens", WIDTH, lengths=cache)
    assert np.array_equal(np.load(cache)[:, 0], lengths)

    class Counted(list):
        reads = 0

        def __getitem__(self, i):
            Counted.reads += 1
            return super().__getitem__(i)

    again = jl.PackedSource(Counted(records), "tokens", WIDTH, lengths=cache)
    assert np.array_equal(again.plan.record, first.plan.record)
    assert Counted.reads <= 4 + np.count_nonzero(lengths == 0)  # the source's fingerprint's
    # records (what the file was kept from; record 0 twice: a source that reads otherwise each
    # time is warned of), and those the file calls empty, which no row reads: checked
    assert first.fingerprint == jl.PackedSource(records, "tokens", WIDTH,
                                                lengths=lengths).fingerprint
    os.remove(f"{cache}.from")  # a file of the user's: read as it is, checked against the data
    with pytest.raises(jl.ConfigError, match=r"lengths=...\) \(from .*train.lengths.npy\): "
                                             r"expected 49 .* shape \(50, 1\).*stale cache"):
        jl.PackedSource(records[:49], "tokens", WIDTH, lengths=cache)


def test_a_path_to_keep_lengths_in_whose_folder_is_not_there_is_refused_before_the_pass():
    # each record's length was found (hours on a corpus), then saving them failed with a bare
    # FileNotFoundError naming a .partial file; a config's ~/cache or $DATA is not expanded
    # (the config audit)
    reads = []

    class Counted(list):
        def __getitem__(self, i):
            reads.append(i)
            return super().__getitem__(i)

    records = Counted({"tokens": np.arange(5)} for _ in range(20))
    for path, said in (("~/no-such-cache/lengths.npy", r"is not there \(~ and \$NAME are not "
                                                      r"expanded"),
                       ("/no-such-folder/lengths.npy", r"is not there; make the folder")):
        with pytest.raises(jl.ConfigError, match=f"{path}: expected a path .*{said}"):
            jl.PackedSource(records, "tokens", WIDTH, lengths=path)
        with pytest.raises(jl.ConfigError, match=said):
            jl.FilteredSource(records, lambda r: True, indices=path)
        assert len(reads) <= 8, reads  # (the fingerprints' records, 0 twice: no pass)
        reads.clear()
        with pytest.raises(jl.ConfigError, match="expected keep .* or indices"):  # (no pass
            jl.FilteredSource(records, indices=path)  # to come: its file is missing; the
            # twenty-first review)


@pytest.mark.parametrize("change", [+3, -3])
@pytest.mark.parametrize("ragged", [False, True])
def test_lengths_kept_from_data_that_has_changed_are_found_again_or_refused(tmp_path, change,
                                                                           ragged):
    # packed by stale lengths, rows would silently lose tokens (or take the next record's)
    records = [{"tokens": np.full(10, i + 1, np.int32)} for i in range(20)]
    cache = tmp_path / "train.lengths.npy"
    jl.PackedSource(records, "tokens", 32, lengths=cache)
    changed = [{"tokens": np.full(10 + change, i + 1, np.int32)} for i in range(20)]
    if ragged:
        offsets = np.arange(21) * (10 + change)
        changed = jl.RaggedSource({"tokens": (np.concatenate([r["tokens"] for r in changed]),
                                              offsets)})
    # the file says what it was kept from (the source's fingerprint): found again, and said
    with pytest.warns(UserWarning, match=r"train.lengths.npy was found from another source "
                                         r"than this run's .*found again, and saved over it"):
        packed = jl.PackedSource(changed, "tokens", 32, lengths=cache)
    assert np.load(cache)[:, 0].tolist() == [10 + change] * 20
    with jl.DataLoader(packed, batch_size=len(packed), process_index=0,
                       process_count=1) as loader:
        rows = next(iter(loader))
    assert int((rows["tokens"] > 0).sum()) == 20 * (10 + change)  # every token placed once
    # a file that does not say (the user's own): read as it is, refused where it is not right
    with pytest.warns(UserWarning, match="found again"):
        jl.PackedSource(records, "tokens", 32, lengths=cache)  # (the first lengths again)
    os.remove(f"{cache}.from")
    packed = jl.PackedSource(changed, "tokens", 32, lengths=cache)
    with pytest.raises(jl.RecordError, match=rf"record \d+\['tokens'\] has {10 + change} "
                                             r"tokens, its length in lengths='.*train.lengths"
                                             r".npy' is 10: .*delete a lengths file") as e:
        list(jl.DataLoader(packed, batch_size=len(packed), process_index=0, process_count=1))
    assert isinstance(e.value.__cause__, jl.ConfigError)


def _one_more_token(record):
    return {"tokens": np.append(record["tokens"], 9)}


def test_records_longer_than_their_sources_lengths_say_are_refused_with_the_remedy():
    tokens = jl.RaggedSource({"tokens": (np.ones(30, np.int32), np.arange(11) * 3)})
    grown = jl.MapSource(tokens, _one_more_token)  # (its lengths said kept: they are not)
    with pytest.raises(jl.ConfigError, match=r"record \d+\['tokens'\] has 4 tokens, its length "
                                             r"was 3 when the packing was planned: .*"
                                             r"lengths_kept=False"):
        jl.PackedSource(grown, "tokens", 8)[0]
    packed = jl.PackedSource(jl.MapSource(tokens, _one_more_token, lengths_kept=False),
                             "tokens", 8)
    assert int((packed[0]["tokens"] == 9).sum()) == 2  # two records of 4 a row of 8


def packed_loader(num_workers=0, batch_size=4, process_index=0, process_count=1, method="best_fit"):
    source, _ = documents(300)
    packed = jl.PackedSource(source, "tokens", WIDTH, method=method, bins=4, window=64)
    return lambda: jl.DataLoader(packed, batch_size=batch_size, shuffle=True, seed=3,
                                 num_epochs=None, num_workers=num_workers,
                                 process_index=process_index, process_count=process_count)


@pytest.mark.parametrize("method", ["concat", "best_fit"])
@pytest.mark.parametrize("k", [5, 131])  # past the end of epoch 0 (~110 steps)
def test_resume_is_exact_into_other_worker_and_process_counts(method, k):
    check_resume(packed_loader(method=method), total=k + 6, k=k,
                 make_restored=packed_loader(num_workers=2, method=method))
    check_split_resume(lambda **kw: packed_loader(method=method, **kw), batch_size=4, k=k,
                       steps=6, keys=("tokens", "tokens_segment_ids", "tokens_positions"))


def test_a_state_from_other_packing_is_refused():
    with packed_loader()() as loader:
        take(loader, 2)
        state = loader.state_dict()
    source, _ = documents(300)
    other = jl.PackedSource(source, "tokens", WIDTH, method="best_fit", bins=5, window=64)
    with jl.DataLoader(other, batch_size=4, process_index=0, process_count=1) as loader:
        with pytest.raises(jl.StateDictError, match="fingerprint|source"):
            loader.load_state_dict(state)
    # another seed, as many rows: the refusal's guesses named no packing (the multi-host audit)
    docs = jl.RaggedSource.from_sequences({"x": [list(range(i * 10, i * 10 + 6))
                                                 for i in range(80)]})
    with jl.DataLoader(jl.PackedSource(docs, "x", 12), batch_size=4, process_index=0,
                       process_count=1) as loader:
        state = loader.state_dict()
    with jl.DataLoader(jl.PackedSource(docs, "x", 12, seed=1), batch_size=4, process_index=0,
                       process_count=1) as loader:
        with pytest.raises(jl.StateDictError, match=r"same kind \(packed\) and size.*its "
                                                     r"packing \(a PackedSource's length, "
                                                     r"method, seed"):
            loader.load_state_dict(state)


def test_a_state_from_other_padding_is_refused():
    """Rows padded with another value are other batches: refused, not taken silently; the
    default padding's fingerprint is the one states were saved with before it counted."""
    source, _ = documents(100)
    zeros = jl.PackedSource(source, "tokens", WIDTH).fingerprint
    assert jl.PackedSource(source, "tokens", WIDTH, value=0).fingerprint == zeros
    assert jl.PackedSource(source, "tokens", WIDTH, value=-1).fingerprint != zeros
    assert (jl.PackedSource(source, "tokens", WIDTH, value=-1).fingerprint
            != jl.PackedSource(source, "tokens", WIDTH, value=-2).fingerprint)
    with jl.DataLoader(jl.PackedSource(source, "tokens", WIDTH), batch_size=4,
                       process_index=0, process_count=1) as loader:
        take(loader, 2)
        state = loader.state_dict()
    other = jl.PackedSource(source, "tokens", WIDTH, value=-1)
    with jl.DataLoader(other, batch_size=4, process_index=0, process_count=1) as loader:
        with pytest.raises(jl.StateDictError, match="fingerprint|source"):
            loader.load_state_dict(state)


def test_a_state_from_other_ragged_data_of_the_same_lengths_is_refused():
    offsets = np.array([0, 3, 5, 9])
    saved_over = jl.RaggedSource({"tokens": (np.arange(9), offsets)})
    with jl.DataLoader(saved_over, batch_size=1, process_index=0, process_count=1) as loader:
        take(loader, 1)
        state = loader.state_dict()
    other = jl.RaggedSource({"tokens": (np.arange(9) + 1000, offsets)})
    with jl.DataLoader(other, batch_size=1, process_index=0, process_count=1) as loader:
        with pytest.raises(jl.StateDictError, match="fingerprint|source"):
            loader.load_state_dict(state)


def test_packed_rows_mix_with_other_sources():
    source, _ = documents(100)
    packed = jl.PackedSource(source, "tokens", WIDTH)
    mixture = jl.mix([packed, packed], [0.5, 0.5])
    with jl.DataLoader(mixture, batch_size=8, shuffle=True, process_index=0,
                       process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["tokens"].shape == (8, WIDTH)
    assert len(unpack(batch)) >= 8  # ids and positions checked on the way
    whole = packed.__getitems__(np.arange(len(packed)))["tokens"]
    assert all(any(np.array_equal(row, w) for w in whole) for row in batch["tokens"])


def test_concatenated_or_filtered_sources_give_their_parts_lengths_unread(monkeypatch):
    from jaxloader.derived import packed_source as packing

    a, b = documents(50, seed=1)[0], documents(70, seed=2)[0]
    seqs = [a[i]["tokens"] for i in range(len(a))] + [b[i]["tokens"] for i in range(len(b))]
    keep = np.flatnonzero(np.arange(len(seqs)) % 3 != 1)

    def no_reading(*args):
        raise AssertionError("the lengths come from the parts' own")

    with monkeypatch.context() as patch:
        patch.setattr(packing, "_read_lengths", no_reading)
        both = jl.PackedSource(jl.ConcatSource([a, b]), "tokens", 16, seed=3)
        kept = jl.PackedSource(jl.FilteredSource(jl.ConcatSource([a, b]), indices=keep),
                               "tokens", 16, seed=3)
    for packed, records in ((both, seqs), (kept, [seqs[i] for i in keep])):
        like = jl.PackedSource(jl.RaggedSource.from_sequences({"tokens": records}), "tokens",
                               16, seed=3)
        rows = np.arange(len(like))
        assert len(packed) == len(like)
        for key, value in like.__getitems__(rows).items():
            assert np.array_equal(packed.__getitems__(rows)[key], value), key
    assert jl.ConcatSource([a, [{"tokens": np.arange(3)}]]).lengths("tokens") is None


def test_bad_input_is_named():
    source, _ = documents(10)
    with pytest.raises(jl.ConfigError, match=r"length=...\): expected a row length >= 1.*got 0"):
        jl.PackedSource(source, "tokens", 0)
    with pytest.raises(jl.ConfigError, match=r"method=...\): expected one of .*'greedy'"):
        jl.PackedSource(source, "tokens", 8, method="greedy")
    with pytest.raises(jl.ConfigError, match=r"record 0: expected a dict with key 'ids'"):
        jl.PackedSource([{"tokens": np.arange(3)}], "ids", 8)
    # over a RaggedSource (and a MapSource or FilteredSource over one): a bare KeyError 'ids'
    for over in (source, jl.FilteredSource(source, indices=[0, 1])):
        with pytest.raises(jl.ConfigError, match=r"record 0: expected a dict with key 'ids' .*"
                                                 r"got \['tokens'\]"):
            jl.PackedSource(over, "ids", 8)
    with pytest.raises(jl.ConfigError, match=r"record 0\['x'\]: expected a 1-D array of "
                                             r"numbers.*shape \(2, 2\).*an index key"):
        jl.PackedSource([{"x": np.zeros((2, 2), np.int32)}], "x", 8)
    with pytest.raises(jl.ConfigError, match=r"overlong=...\): 'truncate' with method='concat'"):
        jl.PackedSource(source, "tokens", 8, method="concat", overlong="truncate")  # (ignored)
    with pytest.raises(jl.ConfigError, match=r"overlong=...\): expected one of"):
        jl.PackedSource(source, "tokens", 8, method="concat", overlong="bogus")
    # tokens of other dtypes: one dtype a row (a batch's was the promotion of its records')
    mixed = jl.PackedSource([{"t": np.arange(1, 4, dtype=np.int32 if i else np.int64)}
                             for i in range(8)], "t", 6, seed=None)
    with pytest.raises(jl.ConfigError, match=r"record 1\['t'\] holds tokens of dtype int32, "
                                             r"the first record with tokens holds int64"):
        mixed.__getitems__(np.arange(len(mixed)))
    # the first record with tokens sets it (an empty record 0 is in no row)
    empty_first = jl.PackedSource([{"t": np.zeros(0, np.int64)}] + [
        {"t": np.arange(1, 5, dtype=np.int32)} for _ in range(7)], "t", 6, seed=None)
    assert empty_first[0]["t"].dtype == np.int32
    two_keys = jl.PackedSource([{"a": np.arange(1, 4), "b": np.zeros(0, np.int8)}] * 6,
                               ["a", "b"], 6, seed=None)  # (a key with no tokens anywhere)
    assert two_keys[0]["b"].dtype == np.int8
    with pytest.raises(jl.ConfigError, match=r"RaggedSource\['t'\] offsets: expected integers"):
        jl.RaggedSource({"t": (np.arange(5), np.array([0, 3, 2, 5]))})
    with pytest.raises(jl.ConfigError, match=r"RaggedSource\['t'\] offsets: expected integers"):
        jl.RaggedSource({"t": (np.arange(5), np.array([0, 3, 2, 5], np.uint64))})  # (no wrap)
    with pytest.raises(jl.ConfigError, match=r"PackedSource\(source\): got a mixture.*weights "
                                             r"unused.*jl.mix\(\[PackedSource\(a, ...\), "):
        jl.PackedSource(jl.mix([source, source], [0.7, 0.3]), "tokens", 8)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_parquet_list_column_packs_every_token_once(tmp_path, num_workers):
    pa = pytest.importorskip("pyarrow")  # in the test extra; ParquetSource's dependency
    pq = pytest.importorskip("pyarrow.parquet")
    source, lengths = documents(120)
    records = [source[i]["tokens"].tolist() for i in range(len(source))]
    for part in range(2):  # two files, row groups of 25
        rows = records[part * 60:(part + 1) * 60]
        pq.write_table(pa.table({"tokens": pa.array(rows, pa.list_(pa.int32())),
                                 "id": np.arange(len(rows))}),
                       tmp_path / f"part-{part}.parquet", row_group_size=25)
    files = jl.ParquetSource([tmp_path / "part-0.parquet", tmp_path / "part-1.parquet"])
    packed = jl.PackedSource(files, "tokens", WIDTH, method="concat",
                             lengths=tmp_path / "lengths.npy")
    assert np.array_equal(np.load(tmp_path / "lengths.npy")[:, 0], lengths)
    with jl.DataLoader(packed, batch_size=4, shuffle=True, last_batch="pad",
                       num_workers=num_workers, process_index=0, process_count=1) as loader:
        seen = [s for batch in loader
                for s in unpack({k: v[batch["mask"]] for k, v in batch.items() if k != "mask"})]
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(1, lengths.sum() + 1))


def test_a_shuffled_packing_over_parquet_past_its_cache_is_warned_with_its_remedies(tmp_path):
    # each row of PackedSource(seed=0) packs records from all over the file: every batch read
    # row groups from the whole of it (15 batches/s against 481 with the remedy), unwarned
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(0)
    records = [rng.integers(1, 1000, n).tolist() for n in rng.integers(5, 15, 2_000)]
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"tokens": pa.array(records, pa.list_(pa.int32()))}), path,
                   row_group_size=100)  # 20 row groups of ~4 KB decoded
    small = dict(cache_bytes=20_000)  # (5 of them)

    def warned(seed, shuffle, tokenized=False, decodes=None, **source):
        files = jl.ParquetSource(path, **source)
        if decodes is not None:  # (the row groups decoded, counted)
            decoded = files._decoded
            files._decoded = lambda *a: decodes.append(a[0]) or decoded(*a)
        records = jl.MapSource(files, lambda r: r) if tokenized else files
        packed = jl.PackedSource(records, "tokens", 64, seed=seed)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with jl.DataLoader(packed, batch_size=4, shuffle=shuffle) as loader:
                if decodes is not None:
                    decodes.clear()
                    list(loader)
        return [str(w.message) for w in caught if w.category is jl.PerformanceWarning]

    decodes = []
    (said,) = warned(0, False, decodes=decodes, **small)
    assert re.search(r"PackedSource\(seed=0\) packs records from all over the files into each "
                     r"row, so its rows read from all 20 row groups at once, whatever the "
                     r"loader's shuffle.*cache_bytes= at least [\d,]+ .*or "
                     r"PackedSource\(seed=None\).*shuffle=jl.LocalShuffle\(window=\d, "
                     r"block_size=\d+\)", said), said
    assert len(decodes) > 10 * 20, len(decodes)  # (each row group decoded again and again)
    window, size = map(int, re.search(r"window=(\d+), block_size=(\d+)", said).groups())
    assert not warned(None, jl.LocalShuffle(window=window, block_size=size), decodes=decodes,
                      **small)
    assert len(decodes) < 3 * 20, len(decodes)  # (the advice: read about once an epoch)
    assert warned(0, jl.LocalShuffle(window=2), **small)  # (no shuffle of the rows helps)
    assert warned(0, False, tokenized=True, **small)[0] == said  # (a MapSource between)
    (said,) = warned(None, True, **small)
    assert "a full shuffle (shuffle=True) of a PackedSource's rows" in said
    (said,) = warned(None, jl.LocalShuffle(window=3 * window, block_size=size), **small)
    assert re.search(rf"LocalShuffle\(window={3 * window}, block_size={size}\) of a "
                     rf"PackedSource's rows \(blocks of {size} rows\) reads up to \d+ row "
                     rf"group\(s\) at a time.*LocalShuffle\(window={window}, ", said), said
    assert not warned(None, False, **small) and not warned(0, True, cache_bytes=1 << 20)


def test_empty_records_of_any_kind_are_passed_over_and_a_keys_rows_keep_one_dtype():
    # an empty Python list (a document that tokenized to nothing) was refused as float64, and
    # an empty array of another dtype made a batch's rows of that dtype, a batch in ten
    lists = [{"tokens": [5, 6, 7]}, {"tokens": []}, {"tokens": [8, 9]}]
    assert jl.PackedSource(lists, "tokens", 8, seed=None)[0]["tokens"].tolist() == [
        5, 6, 7, 8, 9, 0, 0, 0]
    pairs = [{"inputs": np.arange(1, 6, dtype=np.int32) + i,
              "targets": np.arange(1, 4, dtype=np.int32) if i % 10 else np.zeros(0, np.int64)}
             for i in range(40)]
    packed = jl.PackedSource(pairs, ["inputs", "targets"], {"inputs": 16, "targets": 8},
                             seed=None, bins=np.int64(4), window=np.int64(20))  # (NumPy ints)
    assert {str(packed.__getitems__(np.array([r]))["targets"].dtype)
            for r in range(len(packed))} == {"int32"}
    with pytest.raises(jl.ConfigError, match=r"PackedSource\(bins=...\): expected an int >= 1"):
        jl.PackedSource(pairs, "inputs", 16, bins=0)


def test_a_map_that_makes_the_packed_key_without_lengths_kept_false_is_told_so(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["1 2 3", "4 5"]}), tmp_path / "text.parquet")
    text = jl.ParquetSource(tmp_path / "text.parquet")

    def tokenize(r):
        return {"input_ids": np.array(r["text"].split(), np.int32)}

    with pytest.raises(jl.ConfigError, match=r"MapSource\(.*tokenize\)\.lengths\('input_ids'\): "
                                             r"lengths_kept=True takes the source's lengths, "
                                             r"and it has none: .*pass lengths_kept=False"):
        jl.PackedSource(jl.MapSource(text, tokenize), "input_ids", 8)
    assert len(jl.PackedSource(jl.MapSource(text, tokenize, lengths_kept=False), "input_ids",
                               8)) == 1


def test_a_nested_list_column_is_said_to_be_one(tmp_path):
    # list<list<int32>> tokens (a tokenizer's (1, n) rows written as they are) were "expected
    # a 1-D array ..., got shape (1,) dtype object" at a worker's first row (the long-context
    # audit; its lengths, the outer lists', are read without a row, as the source's own)
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"tokens": [[[1, 2, 3, 4, 5]], [[6, 7]]]}), tmp_path / "n.parquet")
    with pytest.raises(jl.RecordError, match=r"record 0\['tokens'\]: expected a 1-D array .*"
                                             r"\(a list of lists: a nested column"):
        packed = jl.PackedSource(jl.ParquetSource(tmp_path / "n.parquet"), "tokens", 8)
        next(iter(jl.DataLoader(packed, batch_size=1, process_index=0, process_count=1)))
    with pytest.raises(jl.ConfigError, match=r"pass its \[0\]"):
        jl.PackedSource([{"t": np.arange(1, 5).reshape(1, 4)}], "t", 8)
    # lists of lists of other lengths (a tokenizer's batch of sentences, pre-tokenized JSON):
    # NumPy's bare "setting an array element with a sequence", no record, key or remedy
    with pytest.raises(jl.ConfigError, match=r"record 1\['t'\]: .* got lists of other lengths "
                                             r"\(a list of lists: a nested column"):
        jl.PackedSource([{"t": [1, 2, 3]}, {"t": [[4, 5], [6]]}], "t", 8)
    # text packed untokenized: "got shape () dtype <U5", no remedy
    with pytest.raises(jl.ConfigError, match=r"dtype <U5 \(text: tokenize it first"):
        jl.PackedSource([{"t": "a b c"}], "t", 8)


def test_a_mixture_of_rows_of_two_lengths_is_told_it_is_the_shape_not_a_cast():
    # a curriculum's mix of 2,048- and 8,192-token rows was told to cast (the long-context
    # audit)
    records = [{"t": np.arange(1, 9, dtype=np.int32)}] * 4
    short, longer = jl.PackedSource(records, "t", 4), jl.PackedSource(records, "t", 8)
    with pytest.raises(jl.ConfigError, match=r"their shapes differ past the batch.s axis: pad "
                                             r"or crop .*PackedSources of other lengths"):
        jl.mix([short, longer], [1, 1])  # (as the mix is made, since its rows' kind is known)


def test_a_mixture_of_rows_of_other_token_dtypes_is_refused_as_it_is_made():
    # int32 rows mixed with int64 ones (a datasets map of Python ints) failed in a worker at
    # the first batch, naming a ConcatSource the user never made (the journey audit)
    short = jl.PackedSource([{"t": np.arange(1, 9, dtype=np.int32)}] * 4, "t", 8)
    wide = jl.PackedSource([{"t": np.arange(1, 9, dtype=np.int64)}] * 4, "t", 8)
    with pytest.raises(jl.ConfigError, match=r"batch leaf \['t'\]: .*int64\(8,\) in "
                                             r"mix\(sources\)\[1\].*jl.MapSource\(part, fn\)"):
        jl.mix([short, wide], [1, 1])


def test_an_empty_sequence_leaves_the_tokens_dtype_as_the_others_make_it():
    # np.asarray([]) is float64: one empty document (a tokenizer's [] for empty text) made
    # every token id of the key a float, packed as 11., 12., 13. without a word
    for tokens in ([[11], [], [12, 13]], [np.array([11], np.int32), [], np.array([12, 13],
                                                                                   np.int32)]):
        ragged = jl.RaggedSource.from_sequences({"t": tokens})
        assert ragged[0]["t"].dtype == np.asarray(tokens[0]).dtype, ragged[0]["t"].dtype
        packed = jl.PackedSource(ragged, "t", 4, seed=None)
        assert packed[0]["t"].tolist() == [11, 12, 13, 0] and packed[0]["t"].dtype.kind == "i"
    assert jl.RaggedSource.from_sequences({"t": [[], []]})[0]["t"].dtype == np.int64
    assert jl.RaggedSource.from_sequences({"t": [[0.5], []]})[1]["t"].dtype == np.float64


class _Tokens:  # records of token arrays, no lengths of its own (read one by one)
    def __init__(self, sequences):
        self.sequences = sequences

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, i):
        return {"t": np.asarray(self.sequences[i], np.int32)}


def test_a_record_lengths_given_call_empty_is_checked_though_no_row_reads_it(tmp_path):
    # a record given length 0 was left out of the plan and never read: its tokens were lost
    # without a word (a stale lengths file over a record filled since too), where one given
    # 1 for its 2 tokens was refused
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    for source in (jl.RaggedSource.from_sequences({"t": sequences}), _Tokens(sequences)):
        with pytest.raises(jl.ConfigError, match=r"record 1\['t'\] has 2 tokens, its length in "
                                                 r"lengths=\(an array\) is 0"):
            jl.PackedSource(source, "t", 8, lengths=np.array([3, 0, 4]))
    kept = str(tmp_path / "lengths.npy")  # (records 0, n // 2 and n - 1 name the data: the
    before = [[1, 2], [], [3], [4, 5], [6]]  # file is found again where one of them changed)
    jl.PackedSource(_Tokens(before), "t", 4, lengths=kept)  # (kept: 2, 0, 1, 2, 1)
    with pytest.raises(jl.ConfigError, match=r"record 1\['t'\] has 3 tokens, its length in "
                                             r"lengths='.*lengths.npy' is 0"):
        jl.PackedSource(_Tokens([[1, 2], [9, 9, 9], [3], [4, 5], [6]]), "t", 4, lengths=kept)
    packed = jl.PackedSource(_Tokens(before), "t", 4, lengths=kept)
    assert sorted(t for i in range(len(packed)) for t in packed[i]["t"].tolist() if t) == [
        1, 2, 3, 4, 5, 6]  # (the empty record, as kept: nothing lost)


def test_a_key_named_twice_is_refused_naming_it_not_the_length():
    # it said the row length 8, a valid one, was not >= 1
    with pytest.raises(jl.ConfigError, match=r"PackedSource\(keys=...\): 't' is named twice"):
        jl.PackedSource(_Tokens([[1, 2]]), ["t", "t"], 8)


def test_a_key_named_as_another_keys_field_is_refused_not_overwritten():
    # ["a", "a_positions"]: a's positions were replaced by the other key's tokens, and a stream's
    # segment ids by a field of the records, padding no longer 0 (the sources audit)
    ragged = jl.RaggedSource.from_sequences({"a": [[1, 2], [3]], "a_positions": [[10], [20, 30]]})
    with pytest.raises(jl.ConfigError, match=r"PackedSource\(keys=...\): the keys 'a' and "
                                             r"'a_positions' both make a field 'a_positions' .* "
                                             r"rename 'a_positions' in the records"):
        jl.PackedSource(ragged, ["a", "a_positions"], 4, seed=None)

    def records(shard):
        yield {"a": np.array([1, 2], np.int32), "a_segment_ids": np.array([7, 7], np.int32)}

    stream = jl.Stream.from_generator(records, shards=1)
    with pytest.raises(jl.ConfigError, match=r"PackedStream\(key\): the keys 'a' and "
                                             r"'a_segment_ids' both make a field"):
        jl.PackedStream(stream, ["a", "a_segment_ids"], 4)
    packed = jl.PackedSource(ragged, ["a_positions"], 4, seed=None)  # (alone: its own fields)
    assert sorted(packed[0]) == ["a_positions", "a_positions_positions",
                                 "a_positions_segment_ids"]
