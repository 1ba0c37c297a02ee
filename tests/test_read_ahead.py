"""A replay's read-ahead (store/blobs.py, ``ReadAhead``): checkpoints read and verified on a
thread, in the order the record committed them, from the first one the replay asks for, within
a budget; passed-over ones dropped; corrupt bytes never served. Real checkpoints, written by the
background materializer into a real store."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from flortrain.checkpoint import codec
from flortrain.checkpoint.blob import deserialize
from flortrain.checkpoint.key import CheckpointKey
from flortrain.checkpoint.materializer import BackgroundMaterializer
from flortrain.checkpoint.staging import EXTERNAL_MIN
from flortrain.store import blobs
from flortrain.store.blobs import BlobReader
from flortrain.store.checkpoints import object_path
from flortrain.store.db import Store
from flortrain.store.records import Checkpoint
from tests.outcomes import Outcomes

_N = 6


def _record(
    tmp_path: Path, shared: torch.Tensor | None = None
) -> tuple[Store, list[tuple[str, str, int]], list[torch.Tensor]]:
    """Six checkpoints, each holding a tensor of its own stored as an object (and ``shared``, if
    given, in every one of them, as ``f``); their rows in commit order, and their own tensors."""
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    values = [torch.full((4 * EXTERNAL_MIN,), float(i)) for i in range(_N)]  # 1 MB each: objects
    for i, v in enumerate(values):
        objects = {"t": {"kind": "tensor", "value": v}}
        if shared is not None:
            objects["f"] = {"kind": "tensor", "value": shared}
        m.submit(str(CheckpointKey("L1", "M1", 0, i)), "L1", {"objects": objects})
    m.flush()
    assert list(results.committed) == [str(CheckpointKey("L1", "M1", 0, i)) for i in range(_N)]
    checkpoints = store.checkpoints(run)
    assert list(checkpoints) == list(
        results.committed
    )  # the order they were committed in, not the keys' order
    return store, list(checkpoints.values()), values


def _cached(reader: BlobReader, order: list[Checkpoint], i: int) -> bool:
    data = reader._read_blob(order[i])
    assert data is not None
    return all(sha in reader._objects for sha in codec.object_refs(data))


def _settle(ahead: blobs.ReadAhead) -> None:
    """Until the read-ahead thread waits (its budget reached or nothing left)."""
    deadline = time.monotonic() + 30
    last = -1
    while True:
        with ahead.cond:
            idle = ahead.reading is None and ahead.next == last
            last = ahead.next
        if idle:
            return
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_read_ahead_serves_the_same_bytes_from_the_first_one_asked_for_within_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, order, values = _record(tmp_path)
    one = order[0].nbytes
    monkeypatch.setattr(blobs, "READ_AHEAD_BYTES", int(2.5 * one))
    reader = BlobReader(store.blobs)
    reader.read_ahead(order, codec.object_refs)
    ahead = reader._ahead
    assert ahead is not None
    time.sleep(0.2)
    assert ahead.thread is None and not reader._objects  # nothing is read before the replay asks

    first = reader.read_blob(order[1])  # a worker's segment starts at 1
    assert first is not None
    _settle(ahead)
    assert [_cached(reader, order, i) for i in range(_N)] == [False, False, True, True, True, False]
    # 2, 3 and 4 read ahead of 1 (the budget is two and a half checkpoints); 1 was read by the
    # replay itself, and its object is read when it is restored
    assert set(ahead.blobs) == {order[i].path for i in (2, 3, 4)}

    reader._objects.clear()  # so that each restore below must come from the read-ahead or disk
    for i in (1, 2, 3, 4, 5):
        data = reader.read_blob(order[i])
        assert data is not None
        got = deserialize(data, reader.read_object)["objects"]["t"]["value"]
        assert torch.equal(got, values[i])
    assert not ahead.blobs


def test_a_checkpoint_the_replay_passes_over_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, order, values = _record(tmp_path)
    monkeypatch.setattr(blobs, "READ_AHEAD_BYTES", int(1.5 * order[0].nbytes))
    reader = BlobReader(store.blobs)
    reader.read_ahead(order, codec.object_refs)
    ahead = reader._ahead
    assert ahead is not None
    assert reader.read_blob(order[0]) is not None
    _settle(ahead)
    assert set(ahead.blobs) == {order[1].path, order[2].path}
    data = reader.read_blob(order[4])  # a jump over 1 to 3
    assert data is not None and torch.equal(
        deserialize(data, reader.read_object)["objects"]["t"]["value"], values[4]
    )
    _settle(ahead)
    assert set(ahead.blobs) == {order[5].path}  # 1 and 2 dropped, 5 read ahead of 4


def test_corrupt_bytes_read_ahead_are_never_served(tmp_path: Path) -> None:
    store, order, _ = _record(tmp_path)
    blob2 = store.read_blob(order[2])
    assert blob2 is not None
    (sha,) = codec.object_refs(blob2)
    path = object_path(store.blobs, sha)
    raw = path.read_bytes()
    path.write_bytes(bytes([raw[0] ^ 0xFF]) + raw[1:])  # one byte of checkpoint 2's object
    reader = BlobReader(store.blobs)
    reader.read_ahead(order, codec.object_refs)
    assert reader._ahead is not None
    assert reader.read_blob(order[1]) is not None
    _settle(reader._ahead)
    assert sha not in reader._objects
    data = reader.read_blob(order[2])
    assert data is not None and reader.read_object(sha) is None
    with pytest.raises(codec.MissingObject):
        deserialize(data, reader.read_object)


def test_objects_a_restore_used_up_leave_the_cache_and_a_shared_one_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkpoint holds a tensor of its own and one every checkpoint shares (a frozen
    table): once the replay takes the next checkpoint, the previous one's own object is let go
    (its memory is what later reads reuse), the shared one is kept, and every restore is exact."""
    frozen = torch.arange(4 * EXTERNAL_MIN, dtype=torch.float32)
    store, order, values = _record(tmp_path, frozen)
    monkeypatch.setattr(blobs, "READ_AHEAD_BYTES", int(2.5 * order[0].nbytes))
    reader = BlobReader(store.blobs)
    reader.read_ahead(order, codec.object_refs)
    ahead = reader._ahead
    assert ahead is not None

    shared = codec.tensor_name(frozen, torch)
    own: list[str] = []
    for i in range(_N):
        data = reader.read_blob(order[i])
        assert data is not None
        objects = deserialize(data, reader.read_object)["objects"]
        assert torch.equal(objects["t"]["value"], values[i]) and torch.equal(
            objects["f"]["value"], frozen
        )
        refs = set(codec.object_refs(data))
        assert shared in refs and len(refs) == 2
        own.extend(refs - {shared})
        _settle(ahead)
        assert shared in reader._objects  # the frozen table stays
        if i >= 2:  # 0 was read by the replay itself; from 1 on they came from the read-ahead
            assert own[i - 1] not in reader._objects
        assert own[i] in reader._objects  # still the latest: a restore may be underway
