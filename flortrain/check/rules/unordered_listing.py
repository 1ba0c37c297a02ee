"""Directory listings in the file system's order, which differs between machines and runs."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check.finding import Edit, Fix, Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit

#: listing functions, by qualified name
_LISTINGS = frozenset({"os.listdir", "os.scandir", "glob.glob", "glob.iglob"})
#: methods of ``pathlib.Path`` that list (the receiver's type is rarely known statically)
_PATH_METHODS = frozenset({"glob", "rglob", "iterdir"})
#: consumers whose result does not depend on the order they are given
_ORDER_FREE = frozenset({"sorted", "set", "frozenset", "len", "min", "max", "any", "all"})
#: consumers that iterate their argument once, in order: ``sorted`` may replace the listing
#: there without changing the kind of value a correct program sees
_ITERATING = frozenset({"list", "tuple", "enumerate"})


class UnorderedListing(Rule):
    code = f"{Family.DETERMINISM}101"
    name = "unordered-listing"
    severity = Severity.WARNING
    message = "directory listing in file-system order, which differs between machines and runs"
    hint = "wrap it in sorted(...)"
    doc = (
        "`os.listdir`, `os.scandir`, `glob.glob` and `Path.glob`/`rglob`/`iterdir` return entries"
        " in the order the file system keeps them. A data set built from that order is shuffled"
        " differently on another machine, after a copy, or on another file system, so the same"
        " seed gives a different run. The fix, `sorted(...)` around the listing, is safe: no"
        " correct program depends on an order that was never specified. A listing sorted later"
        " through its name (`files.sort()`) is not reported; one sorted in another function is."
    )
    valid = (
        Valid("import os\nfiles = sorted(os.listdir('data'))\n"),
        Valid("import os\nn = len(os.listdir('data'))\n"),
        Valid(
            "import os\nfiles = os.listdir('data')\nfiles.sort()\nfor f in files:\n    print(f)\n"
        ),
        Valid("import glob\nif 'a.txt' in glob.glob('*.txt'):\n    pass\n"),
    )
    invalid = (
        Invalid(
            "import os\nfor f in os.listdir('data'):\n    print(f)\n",
            line=2,
            col=10,
            fixed="import os\nfor f in sorted(os.listdir('data')):\n    print(f)\n",
        ),
        Invalid(
            "from glob import glob\nfiles = list(glob('data/*.png'))\n",
            line=2,
            col=14,
            fixed="from glob import glob\nfiles = sorted(glob('data/*.png'))\n",
        ),
        Invalid(
            "from pathlib import Path\nimages = [p for p in Path('data').rglob('*.jpg')]\n",
            line=2,
            col=22,
            fixed="from pathlib import Path\nimages = [p for p in sorted(Path('data').rglob('*.jpg'))]\n",
        ),
        Invalid("import os\nfiles = os.listdir('data')\nfirst = files[0]\n", line=2, col=9),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        sorted_names = _names_sorted_in_place(unit)
        for call in unit.calls:
            if not _is_listing(unit, call):
                continue
            parent = unit.parent(call)
            if isinstance(parent, cst.Arg):
                consumer = unit.parent(parent)
                if isinstance(consumer, cst.Call) and isinstance(consumer.func, cst.Name):
                    if consumer.func.value in _ORDER_FREE:
                        continue
                    if consumer.func.value in _ITERATING and consumer.func.value != "enumerate":
                        yield Hit(call, fix=_replace_callee(unit, consumer))
                        continue
            if isinstance(parent, cst.ComparisonTarget):
                continue  # `x in os.listdir(d)`
            if isinstance(parent, cst.Assign) and all(
                isinstance(t.target, cst.Name) and t.target.value in sorted_names
                for t in parent.targets
            ):
                continue
            iterated = isinstance(parent, cst.For | cst.CompFor) and parent.iter is call
            yield Hit(call, fix=_wrap_sorted(unit, call) if iterated else None)


def _is_listing(unit: Unit, call: cst.Call) -> bool:
    if unit.called(call) & _LISTINGS:
        return True
    func = call.func
    return (
        isinstance(func, cst.Attribute)
        and func.attr.value in _PATH_METHODS
        and not unit.qualified_names(func.value) & {"glob"}
    )


def _names_sorted_in_place(unit: Unit) -> set[str]:
    out: set[str] = set()
    for call in unit.calls:
        f = call.func
        if (
            isinstance(f, cst.Attribute)
            and f.attr.value == "sort"
            and isinstance(f.value, cst.Name)
        ):
            out.add(f.value.value)
    return out


def _wrap_sorted(unit: Unit, call: cst.Call) -> Fix:
    start, end = unit.span(call)
    return Fix((Edit(start, start, "sorted("), Edit(end, end, ")")))


def _replace_callee(unit: Unit, consumer: cst.Call) -> Fix:
    start, end = unit.span(consumer.func)
    return Fix((Edit(start, end, "sorted"),))
