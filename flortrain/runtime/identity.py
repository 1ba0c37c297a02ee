"""Which objects inside a checkpointed state the loop replaced: identity, beside value.

A restore puts a checkpoint's state back *into* the live objects, so that everything referring
to them keeps referring to the restored state (an optimizer to the model's parameters). That is
right for an object that was in its slot before the loop and still is after it. It is wrong for
one the loop replaced: after ``tracker["best"] = Best(step, loss)`` the dict holds a new
object, and the old one, which ``initial = tracker["best"]`` still names, is unchanged. Writing
the new state into the old object would change ``initial`` too, and nothing could tell: ``diff``
compares values, and both sides would print the same wrong value.

So record notes, for every object below a changeset element, whether the object at its path
is the one that was there before:

- a memoized loop's instance compares with its own start (:func:`identities`, taken when the
  instance opens): a replaced object's path is marked 1, and a replay, which restores at the
  instance's start (position 0), makes it anew;
- a main-loop boundary compares with the previous boundary it captured (the loop's entry first),
  and marks each path with the iteration since which its object has been there: a replay that
  jumps from iteration ``i`` makes anew exactly the objects that arrived after ``i``.

The marks (``since``: path to position; absent means "there from the start") travel in the
payload's undigested part: they describe how the record's objects relate, not state ``diff``
compares. :class:`flortrain.checkpoint.restore.Restorer` reads them. Paths are :func:`capture`'s
(``rows[3]``, ``tracker['best']``, ``trainer.stats``), and :func:`identities` walks the objects
the way :func:`capture` does, so that the two name the same object alike
(``test_identity.py`` holds them to it).

A module's plain attributes (``self.stats = {..}`` set in ``forward``) are not walked: they
are restored in place. Walking them (``named_modules`` and every submodule's ``__dict__``) would
cost milliseconds per instance of a block over a large model, paid at every instance recorded,
for a rare shape (a module attribute the loop replaces while another name still holds the old
object). docs/limitations.md says so.

The walk keeps the objects it found, not their ``id``s, until the instance ends (a boundary's,
until the next boundary captured): an ``id`` is reused once its object is freed, and a tensor
view freed in the loop, whose address the loop's new tensor then took, would read as kept, and
the restore would write into the view and so into the tensor it viewed.
Keeping them costs memory only for objects the loop replaces, until its end.
"""

from __future__ import annotations

import collections
import io
import sys
import types
from typing import Any

from flortrain.checkpoint.channels import is_channel
from flortrain.checkpoint.kinds import IMMUTABLE, attr, is_numpy_value, is_rng, is_stateful, item


def identities(roots: dict[str, Any]) -> dict[str, Any]:
    """Every object below each root, by the path :func:`capture` gives it (an object seen twice
    by its first path only, as capture's memo does)."""
    torch = sys.modules.get("torch")
    out: dict[str, Any] = {}
    seen: set[int] = set()
    # depth first, in capture's order, roots one after another: the first path to reach a
    # shared object is the one capture's memo keeps
    stack: list[tuple[str, Any, bool]] = [
        (path, root, True) for path, root in reversed(list(roots.items()))
    ]
    while stack:
        path, obj, root = stack.pop()
        if isinstance(obj, IMMUTABLE) or is_numpy_value(obj) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if not root:  # a root is restored in place by its own name: never replaced
            out[path] = obj
        stack.extend((p, x, False) for p, x in reversed(_inside(obj, path, torch)))
    return out


_NOTHING = object()

#: The prefix of a rebound name's path among the marks (``name:gsum``): beside the paths of
#: objects, which start with the changeset expression of the object holding them.
NAME = "name:"


def name_identities(values: dict[str, Any]) -> dict[str, Any]:
    """Each rebound name's object (not plain values), by :data:`NAME` path. A name
    that still holds its object at the end (``gsum += g`` on an array, ``log += [x]``) is
    restored into the object it holds on replay, which other names may share
    (``gsum = buffers["gsum"]``): stored by value and rebound, it would leave
    ``buffers["gsum"]`` behind."""
    return {
        NAME + k: v
        for k, v in values.items()
        if not (isinstance(v, IMMUTABLE) or is_numpy_value(v))
    }


def shares(value: Any, memo: dict[int, str]) -> bool:
    """Whether an object below ``value`` is one a capture's ``memo`` has seen: a rebound name
    holding objects the state holds (``identities`` of the name alone)."""
    return any(id(o) in memo for o in identities({"": value}).values())


def _inside(obj: Any, path: str, torch: Any) -> list[tuple[str, Any]]:
    """The objects :func:`capture` describes directly inside ``obj``, with their paths."""
    if torch is not None:
        if isinstance(obj, torch.nn.Module):
            return []  # its plain attributes are restored in place: see the module docstring
        if isinstance(obj, torch.Tensor | torch.optim.Optimizer | torch.Generator):
            return []
        if (
            isinstance(obj, torch.optim.lr_scheduler.LRScheduler)
            or type(obj).__name__ == "ReduceLROnPlateau"
        ):
            return []
        if isinstance(obj, torch.utils.data.DataLoader | torch.utils.data.Dataset):
            return []
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray | np.random.RandomState | np.random.Generator):
        return []
    if isinstance(obj, list | tuple | collections.deque):
        return [(item(path, i), x) for i, x in enumerate(obj)]
    if isinstance(obj, dict):
        return [(item(path, k), x) for k, x in obj.items()]
    if (
        isinstance(obj, set | io.IOBase | types.ModuleType)
        or is_rng(obj)
        or is_channel(obj)
        or is_stateful(obj)
    ):
        return []  # a module (`import x` inside the loop) is bound by name, never restored
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return [(attr(path, k), x) for k, x in vars(obj).items()]
    return []


class InstanceMarks:
    """The marks of a memoized loop's instance: a path whose object is not the one
    :func:`identities` found there when the instance opened is marked 1 (a restore at the
    instance's start, position 0, makes it anew)."""

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry
        self.since: dict[str, int] = {}

    def __call__(self, path: str, obj: Any) -> None:
        if self.entry.get(path, _NOTHING) is not obj:
            self.since[path] = 1


class BoundaryMarks:
    """The marks of main-loop boundary ``k``: each path with the iteration since which its object
    has been there, judged against the previous boundary captured (``table``: path to its
    object's id and mark then; the loop's entry holds every object at 0). An object that
    arrived between two captured boundaries is marked with the later one: a jump from between
    them makes it anew, which keeps values right and only loses an identity nothing shared."""

    def __init__(self, table: dict[str, tuple[Any, int]], k: int) -> None:
        self.table = table
        self.k = k
        self.since: dict[str, int] = {}
        self.now: dict[str, tuple[Any, int]] = {}

    def __call__(self, path: str, obj: Any) -> None:
        before = self.table.get(path)
        since = before[1] if before is not None and before[0] is obj else self.k
        self.now[path] = (obj, since)
        if since:
            self.since[path] = since


def entry(roots: dict[str, Any], names: dict[str, Any]) -> dict[str, Any]:
    """What a loop holds as it starts, by path: the objects below its in-place ``roots``, each
    rebound name's object (:func:`name_identities`) and the objects below those. A memoized
    loop's instance compares with it (:class:`InstanceMarks`); a main loop's first boundary
    with it at position 0 (:func:`entry_table`)."""
    out = identities(roots)
    out.update(name_identities(names))
    out.update(identities({NAME + e: v for e, v in names.items()}))
    return out


def entry_table(roots: dict[str, Any], names: dict[str, Any]) -> dict[str, tuple[Any, int]]:
    """A main loop's first :class:`BoundaryMarks` table: every object there at position 0."""
    return {path: (o, 0) for path, o in entry(roots, names).items()}
