"""``[tool.flortrain.check]`` in pyproject.toml: which rules run, where, and how severe."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CheckConfig:
    select: tuple[str, ...] = ()  # code prefixes; empty: every rule
    ignore: tuple[str, ...] = ()
    #: torch release the op lists are taken from (``"2.13"``), never read from an installed torch
    torch_version: str = "2.13"
    severity: dict[str, str] = field(default_factory=dict)  # code -> "error" | "warning"

    def enabled(self, code: str) -> bool:
        if self.select and not any(code.startswith(p) for p in self.select):
            return False
        return not any(code.startswith(p) for p in self.ignore)
