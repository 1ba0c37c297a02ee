"""``flortrain verify``'s report: what the runs showed, and the static hazards behind it.

The hazards are ``flortrain check``'s determinism and RNG findings (``DET``, ``RNG``) on the
script, as record's check finds them. :data:`DETERMINISTIC` is the one table of which of them
``record --deterministic`` addresses (per-example generators for draws in a ``Dataset`` and in
thread and process pools, ``torch.use_deterministic_algorithms(True)``,
``CUBLAS_WORKSPACE_CONFIG``, cuDNN's flags, pinned threads) and which remain whatever the mode:
a seed taken from OS entropy, a listing in file-system order, a loop stopped by the clock.
The JSON form (``--json``) is a stable schema, documented in docs/determinism.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flortrain.check.finding import Finding
from flortrain.commands.comparison import Comparison, Divergence

#: rule code -> what ``record --deterministic`` does about it ("" where it does nothing)
DETERMINISTIC: dict[str, str] = {
    "DET001": "torch.use_deterministic_algorithms(True) picks a deterministic kernel",
    "DET002": "",  # the op raises in that mode: it runs with warn_only, still nondeterministic
    "DET003": "CUBLAS_WORKSPACE_CONFIG is set before torch starts CUDA",
    "DET004": "cuDNN's benchmark is turned off and its deterministic flag on",
    "DET101": "",
    "DET102": "",
    "DET103": "",
    "RNG001": "the draws are rewritten to per-example generators",
    "RNG002": "",
    "RNG003": "",
    "RNG004": "the draws are rewritten to per-example generators",
    "RNG005": "the draws are rewritten to per-example generators",
}

#: JSON schema version of ``verify --json``
SCHEMA = 1


def hazards(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that bear on reproducibility: determinism and RNG rules."""
    return [f for f in findings if f.code.startswith(("DET", "RNG"))]


@dataclass
class Report:
    """Everything verify found, ready to print or to dump as JSON."""

    script: str
    args: list[str]
    comparisons: list[Comparison]
    #: resume boundaries asked for and not possible, and why (no boundary checkpoint)
    no_resumes: str
    findings: list[Finding]
    check_failed: str
    seconds: float

    @property
    def reproducible(self) -> bool:
        return all(c.identical for c in self.comparisons)

    @property
    def first(self) -> tuple[str, Divergence] | None:
        """The first divergence of the first run that diverged."""
        for c in self.comparisons:
            if c.divergences:
                return c.name, c.divergences[0]
        return None

    def lines(self) -> list[str]:
        verdict = "reproducible" if self.reproducible else "NOT reproducible"
        out = [f"verify {self.script}: {verdict} ({self.seconds:.1f}s)"]
        for c in self.comparisons:
            state = "identical" if c.identical else f"{len(c.divergences)} divergence(s)"
            out.append(
                f"  {c.name}: {state}: random streams at {c.boundaries} main-loop boundaries,"
                f" state at {c.checkpoints} checkpoints, {c.lines} output lines compared"
            )
            if c.divergences:
                out.append(f"    first: {c.divergences[0].describe()}")
        if self.no_resumes:
            out.append(f"  no resumes: {self.no_resumes}")
        first = self.first
        if first is not None:
            out.append(f"first divergence ({first[0]}): {first[1].describe()}")
        out.extend(self._hazard_lines())
        return out

    def _hazard_lines(self) -> list[str]:
        if self.check_failed:
            return [f"hazards: flortrain check did not run: {self.check_failed}"]
        found = hazards(self.findings)
        if not found:
            return ["hazards: flortrain check finds none"]
        out = [f"hazards (flortrain check): {len(found)}"]
        for f in found:
            fix = DETERMINISTIC.get(f.code, "")
            out.append(f"  {f.concise()}")
            out.append(
                f"    record --deterministic: {fix}" if fix else "    remains under --deterministic"
            )
        fixed = sum(1 for f in found if DETERMINISTIC.get(f.code))
        out.append(f"  {fixed} addressed by record --deterministic, {len(found) - fixed} remain")
        return out

    def as_json(self) -> dict[str, Any]:
        first = self.first
        return {
            "schema": SCHEMA,
            "script": self.script,
            "args": self.args,
            "reproducible": self.reproducible,
            "seconds": round(self.seconds, 3),
            "runs": [
                {
                    "name": c.name,
                    "identical": c.identical,
                    "boundaries": c.boundaries,
                    "checkpoints": c.checkpoints,
                    "lines": c.lines,
                    "divergences": [d.as_json() for d in c.divergences],
                }
                for c in self.comparisons
            ],
            "no_resumes": self.no_resumes or None,
            "first_divergence": None if first is None else {"run": first[0], **first[1].as_json()},
            "check_failed": self.check_failed or None,
            "hazards": [
                {
                    "path": f.path,
                    "line": f.line,
                    "col": f.col,
                    "code": f.code,
                    "message": f.message,
                    "deterministic": DETERMINISTIC.get(f.code) or None,
                }
                for f in hazards(self.findings)
            ],
        }


__all__ = ["DETERMINISTIC", "SCHEMA", "Report", "hazards"]
