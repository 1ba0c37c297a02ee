"""The rules, one per module; :func:`all_rules` finds them, so adding a rule is adding a file."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from flortrain.check.rule import Rule


@cache
def all_rules() -> tuple[type[Rule], ...]:
    """Every rule, by code."""
    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Rule)
                and value is not Rule
                and value.__module__ == module.__name__
            ):
                if value.code in found:
                    raise RuntimeError(f"two rules with code {value.code}")
                found[value.code] = value
    return tuple(found[c] for c in sorted(found))
