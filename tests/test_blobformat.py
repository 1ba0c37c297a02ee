"""The checkpoint blob format: exact round trips, shared tensors stored once, digests that
depend on values only (checkpoint/codec.py)."""

from __future__ import annotations

import cmath
import json
import math
import os
import random
import subprocess
import sys
import types
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from flortrain.checkpoint import codec, skeleton
from flortrain.checkpoint.blob import deserialize, serialize
from flortrain.replay.divergence import state_differences


def _payload(seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(4, 3, generator=g)
    return {
        "objects": {
            "model": {"kind": "module", "state": OrderedDict(weight=w, bias=torch.zeros(3))},
            "tags": {"kind": "set", "value": {"alpha", "beta", "gamma", "delta"}},
        },
        "extra": {"optimizer#1": {"params": [[w.detach()]], "step": torch.tensor(3.0)}},
        "names": {
            "half": torch.randn(5, generator=g).to(torch.bfloat16),
            "mask": torch.tensor([True, False, True]),
            "scalar": torch.tensor(7, dtype=torch.int64),
            "empty": torch.zeros(0, 2),
            "strided": torch.arange(12.0).reshape(3, 4).t(),
            "plain": (1, 2.5, "x", None),
        },
        "rng": {"random": random.Random(seed).getstate(), "torch": g.get_state()},
        "registry": {"start": 0, "end": 2, "ids": {}},
    }


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and type(a) is type(b)
            and a.keys() == b.keys()
            and all(_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(_equal(x, y) for x, y in zip(a, b, strict=True))
        )  # type: ignore[arg-type]
    return a == b


def test_round_trip_is_exact_for_every_dtype_layout_and_container() -> None:
    payload = _payload()
    data, digests = serialize(payload)
    assert data[:1] == codec.MAGIC
    assert _equal(deserialize(data), payload)
    assert {k for k in digests if "/" not in k} == {
        "objects:model",
        "objects:tags",
        "extra:optimizer#1",
        "names:half",
        "names:mask",
        "names:scalar",
        "names:empty",
        "names:strided",
        "names:plain",
    }


def test_each_tensor_of_a_part_has_a_digest_naming_it() -> None:
    """A part that differs is named by the tensor in it that does (``diff``, ``verify``)."""
    a, b = _payload(), _payload()
    b["objects"]["model"]["state"]["bias"] = torch.ones(3)  # type: ignore[index]
    da, db = serialize(a)[1], serialize(b)[1]
    assert {"objects:model/state.weight", "extra:optimizer#1/params.0.0"} <= set(da)
    assert state_differences(da, db) == ["model.bias"]
    # a step count (no tensor of the part differs) names the part
    b = _payload()
    b["extra"]["optimizer#1"]["lr"] = 0.5  # type: ignore[index]
    assert state_differences(da, serialize(b)[1]) == ["optimizer#1"]
    assert state_differences(da, da) == []


def test_tensors_sharing_memory_are_stored_once() -> None:
    big = torch.randn(256, 256)
    alone, _ = serialize({"objects": {"a": {"t": big}}})
    twice, _ = serialize({"objects": {"a": {"t": big}}, "extra": {"b": {"params": [big.detach()]}}})
    assert len(twice) - len(alone) < 1024 < big.numel() * 4


def test_digests_follow_values_not_object_identity() -> None:
    a, b = _payload(0), _payload(0)
    assert serialize(a)[1] == serialize(b)[1]
    # a string shared by two slots in one run and equal copies in another digest the same
    s = "".join(["sha", "red"])
    shared = {"names": {"x": [s, s]}}
    copies = {"names": {"x": ["".join(["sha", "red"]), "".join(["sha", "red"])]}}
    assert serialize(shared)[1] == serialize(copies)[1]
    c = _payload(0)
    c["objects"]["model"]["state"]["bias"][1] = 1e-7  # type: ignore[index]
    changed, before = serialize(c)[1], serialize(a)[1]
    # the part and its one tensor that changed, nothing else
    assert changed.keys() == before.keys()
    assert {k for k in changed if changed[k] != before[k]} == {
        "objects:model",
        "objects:model/state.bias",
    }


def test_sets_digest_the_same_in_any_iteration_order() -> None:
    one = {"names": {"s": {f"k{i}" for i in range(50)}}}
    other = {"names": {"s": set(reversed(sorted(f"k{i}" for i in range(50))))}}
    assert serialize(one)[1] == serialize(other)[1]
    assert deserialize(serialize(one)[0])["names"]["s"] == one["names"]["s"]


def test_tensors_the_format_does_not_take_fall_back_to_torch_save() -> None:
    odd = torch.eye(3).to_sparse()
    data, digests = serialize({"names": {"odd": odd}, "registry": {}})
    assert data[:1] == b"T"
    assert digests["names:odd"].startswith("w")
    assert torch.equal(deserialize(data)["names"]["odd"].to_dense(), torch.eye(3))


def test_library_modules_in_containers_come_back_as_the_modules_themselves() -> None:
    """A module object cannot be pickled, so ``cfg = {"lib": math}`` would keep its loop from
    ever being checkpointed. A library module is stored by name in flortrain's format, in the
    ``torch.save`` fallback (a sparse tensor beside it) and in plain pickle (no torch)."""
    from flortrain.checkpoint import blob

    cfg = {"lib": math, "all": [json, os.path], "pair": (cmath, 1)}
    fallback = {"names": {"cfg": cfg, "odd": torch.eye(2).to_sparse()}, "registry": {}}
    for payload, magic in (
        ({"names": {"cfg": cfg}, "registry": {}}, codec.MAGIC),
        (fallback, b"T"),
    ):
        data, _ = serialize(payload)
        assert data[:1] == magic
        back = deserialize(data)["names"]["cfg"]
        assert (
            back["lib"] is math
            and back["all"][0] is json
            and back["all"][1] is os.path
            and back["pair"][0] is cmath
        )
    plain = b"P" + codec.pickle_dumps({"names": {"cfg": cfg}})
    assert blob.deserialize(plain)["names"]["cfg"]["lib"] is math


def test_a_project_module_is_not_stored_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module of the project may hold state the loop changes (its globals): a name would not
    restore it, so a container holding one stays unstorable (the loop re-executes)."""
    (tmp_path / "helpers.py").write_text("COUNT = 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import helpers  # type: ignore[import-not-found]

    try:
        with pytest.raises(skeleton.Unsupported):
            skeleton.stage({"names": {"cfg": {"h": helpers}}, "registry": {}}, torch)
        lazy = types.ModuleType("not_registered")
        with pytest.raises(skeleton.Unsupported):  # not in sys.modules under its name
            skeleton.stage({"names": {"cfg": {"m": lazy}}, "registry": {}}, torch)
    finally:
        sys.modules.pop("helpers", None)


def test_a_set_of_modules_digests_the_same_in_any_process() -> None:
    """A set is stored sorted by ``repr``; a module's placeholder must not repr by its address
    (or different import orders would give different digests)."""
    code = (
        "import {order}, torch\n"
        "from flortrain.checkpoint import skeleton\n"
        "import cmath, json, math, os\n"
        "print(skeleton.stage({{'names': {{'s': {{math, cmath, json, os}}}}, 'registry': {{}}}}, torch).skeletons)"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code.format(order=order)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for order in ("json, cmath, math", "math, os, cmath, json", "os, json")
    }
    assert len(outs) == 1, outs


def test_views_of_one_storage_come_back_views_of_one_storage_with_their_strides() -> None:
    """Copied one by one, ``head = flat[:3]`` would come back a tensor ``flat.mul_(2)`` no longer
    reached, and a transposed tensor would come back contiguous."""
    flat = torch.arange(10.0)
    wt = torch.arange(12.0).reshape(3, 4).t()
    payload = {"names": {"flat": flat, "head": flat[:3], "tail": flat[5:], "wt": wt}}
    data, digests = serialize(payload)
    back = deserialize(data)["names"]
    assert _equal(back, payload["names"])
    assert back["wt"].stride() == wt.stride() and not back["wt"].is_contiguous()
    back["flat"].mul_(2)
    assert back["head"].tolist() == [0.0, 2.0, 4.0] and back["tail"][0].item() == 10.0
    # the same sharing over other objects with the same values digests the same (record and a
    # replay that executes the instance)
    flat2 = torch.arange(10.0)
    again = {
        "names": {
            "flat": flat2,
            "head": flat2[:3],
            "tail": flat2[5:],
            "wt": torch.arange(12.0).reshape(3, 4).t(),
        }
    }
    assert serialize(again)[1] == digests


def test_views_far_apart_in_a_big_storage_are_copied_alone() -> None:
    """Two rows of a large table: staging the span between them would copy the table."""
    table = torch.randn(1000, 64)
    payload = {"names": {"first": table[0], "last": table[-1]}}
    data, _ = serialize(payload)
    assert len(data) < 4 * table.numel() // 10
    back = deserialize(data)["names"]
    assert _equal(back, payload["names"])
    back["first"].add_(1)
    assert back["last"].tolist() == table[-1].tolist()


def test_a_trained_leaf_keeps_its_parameter_type_requires_grad_and_grad() -> None:
    w = torch.zeros(3, requires_grad=True)
    w.grad = torch.ones(3)
    p = torch.nn.Parameter(torch.ones(2))
    back = deserialize(serialize({"names": {"w": w, "p": p, "plain": torch.ones(1)}})[0])["names"]
    assert (
        back["w"].requires_grad and back["w"].is_leaf and back["w"].grad.tolist() == [1.0, 1.0, 1.0]
    )
    assert type(back["p"]) is torch.nn.Parameter and back["p"].requires_grad
    assert not back["plain"].requires_grad
