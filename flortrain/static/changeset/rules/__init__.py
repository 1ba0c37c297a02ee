"""The changeset rules, one per module; :func:`all_rules` finds them, so adding a rule is adding
a file. Flor's Table 2 are rules 0-5, highest precedence first; the others are what flortrain
adds to them."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from flortrain.static.changeset.rule import ChangesetRule


@cache
def all_rules() -> tuple[type[ChangesetRule], ...]:
    """Every rule: Table 2's in its order, then flortrain's own by name."""
    found: list[type[ChangesetRule]] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, ChangesetRule)
            and value is not ChangesetRule
            and value.__module__ == module.__name__
        ]
    return tuple(sorted(found, key=lambda r: (r.number is None, r.number or 0, r.name)))
