"""Identity across a restore (``runtime/identity.py``, ``restore.Restorer``): objects the loop
replaced are made anew, objects it kept are restored in place, and an object held in two places
is one object afterwards. The end-to-end shapes are in ``test_real_patterns.py``; the script here
trains by hand (a torch.optim optimizer imports torch._dynamo, about a CPU-second a process)."""

from __future__ import annotations

import collections
import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from flortrain.checkpoint.capture import capture
from flortrain.checkpoint.kinds import Unrestorable
from flortrain.checkpoint.restore import Restorer, why_unrestorable
from flortrain.runtime.identity import BoundaryMarks, InstanceMarks, entry_table, identities
from tests.protocol import replay_matches_plain


class Holder:
    def __init__(self) -> None:
        self.stats = {"n": 0, "hist": [1.0]}
        self.rng = torch.Generator().manual_seed(1)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)
        self.fc.cache = [torch.zeros(2)]  # a plain attribute of a submodule
        self.calls = {"n": 0}


def _roots() -> dict[str, Any]:
    row = {"a": [1, 2], "t": torch.ones(3)}
    return {
        "rows": [row, {"b": collections.deque([torch.zeros(1)], maxlen=4)}],
        "by_key": {("x", 1): row, "h": Holder()},
        "net": Net(),
    }


def test_identities_name_each_object_by_the_path_capture_gives_it() -> None:
    """The walk at a loop's start and the capture at its end must name an object alike, or every
    object would seem replaced (slow) or a replaced one kept (wrong)."""
    roots = _roots()
    memo: dict[int, str] = {}
    for expr, o in roots.items():
        capture(o, memo, expr)
    # a module's plain attributes are restored in place, unwalked (``identity``'s docstring)
    captured = {
        path: i for i, path in memo.items() if path not in roots and not path.startswith("net.")
    }
    assert {p: id(o) for p, o in identities(roots).items()} == captured
    assert "by_key[('x', 1)]" not in captured  # the row's second sighting is a ref to rows[0]
    assert "by_key['h'].stats" in captured and "rows[1]['b'][0]" in captured
    assert "net.fc.cache" in memo.values()


def test_marks_name_only_what_the_loop_replaced() -> None:
    roots = _roots()
    marks = InstanceMarks(identities(roots))
    roots["rows"][0]["a"].append(3)  # changed in place: not replaced
    roots["by_key"]["h"].stats = {"n": 1}  # replaced
    roots["rows"].append({"c": 1})  # new
    memo: dict[int, str] = {}
    for expr, o in roots.items():
        capture(o, memo, expr, marks)
    assert marks.since == {"by_key['h'].stats": 1, "rows[2]": 1}


def test_a_replaced_object_is_made_anew_and_a_kept_one_restored_in_place() -> None:
    keep = [0]
    old = {"v": 1}
    live = {"keep": keep, "old": old}
    marks = InstanceMarks(identities({"live": live}))
    keep.append(1)
    live["old"] = {"v": 2}
    state = capture(live, {}, "live", marks)
    # back to the loop's start, as a replay is when it restores
    keep.pop()
    live["old"] = old
    Restorer(marks.since, 0).into(live, state, "live")
    assert live["keep"] is keep and keep == [0, 1]
    assert live["old"] == {"v": 2} and live["old"] is not old and old == {"v": 1}


def test_a_boundary_marks_each_object_with_the_iteration_it_arrived_by() -> None:
    a, b = {"v": 0}, {"v": 1}
    live = {"a": a, "b": b}
    table = entry_table({"live": live}, {})
    live["b"] = b2 = {"v": 2}  # replaced during iteration 0..2
    m3 = BoundaryMarks(table, 3)
    state3 = capture(live, {}, "live", m3)
    assert m3.since == {"live['b']": 3}
    m5 = BoundaryMarks(m3.now, 5)
    capture(live, {}, "live", m5)
    assert m5.since == {"live['b']": 3}  # still the one that arrived by 3
    # a jump from iteration 4 restores b2's state into b2; one from 1 makes it anew
    live2 = {"a": a, "b": b2}
    Restorer(m3.since, 4).into(live2, copy.deepcopy(state3), "live")
    assert live2["b"] is b2
    live1 = {"a": a, "b": b}
    Restorer(m3.since, 1).into(live1, copy.deepcopy(state3), "live")
    assert live1["b"] is not b and live1["b"] == {"v": 2} and b == {"v": 1}


def test_a_replaced_module_cannot_be_made_anew_and_says_so_before_anything_is_restored() -> None:
    nets = [torch.nn.Linear(2, 2)]
    marks = InstanceMarks(identities({"nets": nets}))
    nets.append(copy.deepcopy(nets[0]))  # snapshot ensembles
    state = capture(nets, {}, "nets", marks)
    why = why_unrestorable({"nets": state}, marks.since, 0)
    assert why is not None and "`nets[1]` holds a module" in why
    with pytest.raises(Unrestorable):
        Restorer(marks.since, 0).fresh(state["items"][1], "nets[1]")


def test_a_loop_that_appends_modules_is_not_checkpointed_and_replays_right(tmp_path: Path) -> None:
    """Snapshot ensembles (``snaps.append(copy.deepcopy(model))``): a restore cannot make a
    module anew, so record refuses the instance, and the replay runs it."""
    text = (
        "import copy\nimport torch\n"
        "torch.manual_seed(0)\n"
        "model = torch.nn.Linear(4, 1)\n"
        "snaps = []\n"
        "x, y = torch.randn(16, 4), torch.randn(16, 1)\n"
        "for epoch in range(3):\n"
        "    for i in range(4):\n"
        "        loss = ((model(x) - y) ** 2).mean()\n"
        "        loss.backward()\n"
        "        with torch.no_grad():\n"
        "            for p in model.parameters():\n"
        "                p -= 0.1 * p.grad\n"
        "        model.zero_grad()\n"
        "        if i == 3:\n"
        "            snaps.append(copy.deepcopy(model))\n"
        "    #PROBE\n"
        '    print(epoch, f"{loss.item():.6f}")\n'
    )
    probe = 'print("PROBE", epoch, len(snaps), round(snaps[-1].weight.sum().item(), 6))'
    rep = replay_matches_plain(tmp_path, text, probe, {"FLORTRAIN_PERIOD": "every"})
    assert "0 block instances skipped, 3 executed" in rep.err, rep.err


class _Loader:
    """Like ``ctypes.cdll``: an unknown attribute is a library to load, and a missing one raises
    ``OSError``, not ``AttributeError``."""

    def __getattr__(self, name: str) -> Any:
        raise OSError(f"{name}: cannot open shared object file")


def test_the_walk_survives_objects_whose_attributes_raise_other_errors() -> None:
    """A module imported inside the loop (``import sys as _s``) could lead the walk to
    ``ctypes.cdll``, whose ``hasattr(.., "state_dict")`` raises ``OSError``, and every boundary
    of the loop would fail. Modules are not walked, and such an object is a plain object."""
    import sys

    holder = Holder()
    holder.loader = _Loader()  # type: ignore[attr-defined]
    found = identities({"h": holder, "mod": {"sys": sys}})
    assert found["h.loader"] is holder.loader and found["mod['sys']"] is sys
    assert not any(p.startswith("mod['sys'].") for p in found)
    assert capture(holder, {}, "h")["items"]["loader"]["kind"] == "object"
