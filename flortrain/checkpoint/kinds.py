"""What a checkpoint meets in a changeset: the kinds of objects and the paths they are named by.

Capture (``capture.py``), restore (``restore.py``), the alias watch's fingerprints
(``fingerprint.py``) and the identity walk (``runtime/identity.py``) all classify objects the same
way and name what lies inside one the same way, so both live here: a restore finds an object's
marks only if it names the object as capture did.
"""

from __future__ import annotations

import collections
import functools
import pickle
import random
import sys
import types
from collections.abc import Callable
from typing import Any

from flortrain.checkpoint.channels import type_name
from flortrain.static import plan

IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), range, frozenset)


#: Called with the path and the object of every captured object below a changeset element (not
#: plain values, not second sightings): how record notes which of them the loop replaced
#: (:mod:`flortrain.runtime.identity`).
Mark = Callable[[str, Any], None]


def item(path: str, key: Any) -> str:
    """The path of a container's item (``rows[3]``, ``tracker['best']``). Capture, the identity
    walk, :func:`children` and :class:`Restorer` all name paths through this and :func:`attr`:
    a restore finds an object's marks only if it names the object as capture did."""
    return f"{path}[{key!r}]"


def attr(path: str, name: str) -> str:
    """The path of an object's attribute (``trainer.stats``): see :func:`item`."""
    return f"{path}.{name}"


class Unrestorable(Exception):
    """An object the checkpoint cannot hold faithfully: the block instance is not memoized."""


class Uncapturable(Unrestorable):
    """An object no kind of capture describes (a lock, a socket, a C extension's object):
    raised with its path, and named whole by :func:`capture_named`."""

    def __init__(self, path: str, obj: Any) -> None:
        self.path = path
        self.type = type_name(obj)
        super().__init__(
            f"cannot capture `{path}` ({self.type}): flortrain has no way to capture a {self.type}"
        )


class CarriesGraph(Unrestorable):
    """A tensor with an autograd graph: training state that a checkpoint cannot hold."""


def graph_of(obj: Any) -> Any:
    """The autograd node a tensor hangs from (``grad_fn``), or None."""
    torch = loaded_torch()
    return obj.grad_fn if torch is not None and isinstance(obj, torch.Tensor) else None


def carries_graph(path: str, obj: Any) -> str:
    """Why a tensor with a ``grad_fn`` cannot be checkpointed. Restored, it would be a detached
    leaf: a later ``backward()`` through it (REINFORCE's ``torch.stack(log_probs).sum()``, a
    ``total = total + loss`` accumulated over the loop) would miss every parameter upstream and
    the update would be silently lost. The instance executes instead."""
    return plan.carries_graph(path, type(obj.grad_fn).__name__)


def loaded_torch() -> Any:
    return sys.modules.get("torch")


def is_data_source(obj: Any) -> bool:
    """Data loaders and datasets are inputs, re-created or re-iterated by the script itself; only
    the random generators they draw from are state (see :func:`data_source_rngs`)."""
    torch = loaded_torch()
    return torch is not None and isinstance(
        obj, torch.utils.data.DataLoader | torch.utils.data.Dataset
    )


def data_source_rngs(obj: Any) -> dict[str, Any]:
    """The random generators iterating a data source advances, by attribute path: a loader's
    ``generator``, its sampler's and batch sampler's, and generators a dataset keeps for its own
    augmentation (``self.rng.normal(..)`` in ``__getitem__``), through wrappers like ``Subset``.
    Only public attributes of torch's data classes and of the user's Dataset/Sampler subclasses
    are followed, a few levels deep: anything else is data, not stream state."""
    torch = loaded_torch()
    found: dict[str, Any] = {}
    if torch is None:
        return found
    data = torch.utils.data
    seen: set[int] = set()

    def walk(o: Any, path: str, depth: int) -> None:
        if id(o) in seen or depth > 4:
            return
        seen.add(id(o))
        for k, v in list(vars(o).items()):
            if k.startswith("_") or v is None:
                continue
            p = attr(path, k) if path else k
            if is_rng(v):
                if id(v) not in seen:
                    seen.add(id(v))
                    found[p] = v
            elif isinstance(v, data.DataLoader | data.Dataset | data.Sampler) and hasattr(
                v, "__dict__"
            ):
                walk(v, p, depth + 1)

    if hasattr(obj, "__dict__"):
        walk(obj, "", 0)
    return found


def attr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@functools.cache
def _library() -> tuple[str, ...]:
    """Where the standard library and installed packages live (a venv's and the base
    interpreter's). Asked for on the first module a capture meets, not at import: ``sysconfig``
    and its paths cost a recorded run's start-up time that most scripts never need."""
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(
        {p for scheme in ("stdlib", "platstdlib", "purelib", "platlib") if (p := paths.get(scheme))}
    )


def library_module(obj: Any) -> str | None:
    """The name of ``obj`` when it is a module of the standard library or of an installed
    package that ``sys.modules`` holds under that name: state a checkpoint names instead of
    storing (``cfg = {"lib": math}``: a module object cannot be pickled, and a restore gets the
    very module back by importing the name). A module of the project is not one: the loop may
    change its globals, which a name would not restore, so a container holding one stays
    unstorable and its loop re-executes."""
    if not isinstance(obj, types.ModuleType):
        return None
    name = getattr(obj, "__name__", None)
    if not isinstance(name, str) or sys.modules.get(name) is not obj:
        return None
    path = getattr(obj, "__file__", None)
    if path is None:
        return name if name in sys.builtin_module_names else None
    if isinstance(path, str) and not path.startswith("/") and "." in name:
        # a module object a package makes itself (``torch.ops``, whose ``__file__`` is
        # ``_ops.py``): its package's, as the package is
        top = sys.modules.get(name.split(".", 1)[0])
        return name if top is not None and library_module(top) is not None else None
    return name if isinstance(path, str) and path.startswith(_library()) else None


_CLASSES: dict[type, bool] = {}


def picklable_class(cls: type) -> bool:
    """Whether pickle finds ``cls`` again by its name (not a class made inside a function): only
    then can a checkpoint name it, and a restore make a new instance of it."""
    ok = _CLASSES.get(cls)
    if ok is None:
        try:
            ok = pickle.loads(pickle.dumps(cls)) is cls
        except Exception:
            ok = False
        _CLASSES[cls] = ok
    return ok


def is_numpy_value(obj: Any) -> bool:
    """NumPy scalars (``np.int64``, ``np.float32``) and dtypes are immutable values, like ``int``:
    they are stored whole and put back by rebinding (gymnasium spaces and counters hold them)."""
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, np.generic | np.dtype)


CONTAINERS = (list, tuple, dict, set, collections.deque)


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` keeps its state behind ``state_dict``/``load_state_dict`` (a scheduler, a
    sampler, a user's tracker). Asked of any object a changeset reaches, some of which answer
    an unknown attribute with something other than ``AttributeError``: ``ctypes.cdll.state_dict``
    tries to load a library of that name and raises ``OSError`` (a module imported inside the
    loop reaches it), which would make every boundary of the loop fail."""
    try:
        return hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
    except Exception:
        return False


def is_rng(obj: Any) -> bool:
    torch = loaded_torch()
    np = sys.modules.get("numpy")
    return (
        isinstance(obj, random.Random)
        or (torch is not None and isinstance(obj, torch.Generator))
        or (np is not None and isinstance(obj, np.random.RandomState | np.random.Generator))
    )
