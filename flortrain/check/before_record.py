"""``flortrain check`` as ``flortrain record`` runs it: the same findings, as warnings before
training.

The check runs beside the rest of record's static pass (in its forked child when there is one,
:mod:`flortrain.process.static_child`), so that it costs the training process no time there. Its result
is plain data that unpickles without libcst. An error-level finding is still only a warning
here: record runs the script whatever the check says, and changes nothing the script computes
or prints on stdout.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flortrain.check.finding import Finding
from flortrain.errors import FlortrainError

if TYPE_CHECKING:
    from flortrain.static.plan import Plan
    from flortrain.static.source import Source

#: the prefix of every line record prints for a finding
PREFIX = "flortrain: check: "


@dataclass(frozen=True)
class Checked:
    """A script's findings, fixes left out; or why the check could not run (``failed``)."""

    findings: tuple[Finding, ...] = ()
    failed: str = ""


def check(script: str, text: str, parsed: tuple[Source, Plan] | None = None) -> Checked:
    """The findings of ``script`` (whose content is ``text``) under the project's configuration,
    as ``flortrain check --force-exclude script`` finds them (an excluded script has none);
    ``parsed`` is the static pass's own parse and plan of that text, reused. A bad configuration
    or a failing check is the check's problem, never the run's: the record goes on, saying so in
    one line."""
    try:
        # imported here, not above: record's training process imports this module for `warn`
        # and `Checked`, and must not load libcst (a script sees sys.modules as under python)
        from flortrain.check.discovery import discover
        from flortrain.check.pyproject import Configs
        from flortrain.check.runner import check_text

        configs = Configs()
        found = [
            f
            for path in discover([script], configs, force_exclude=True)
            for f in check_text(path, text, configs.for_file(path), parsed=parsed)
        ]
    except FlortrainError as e:
        return Checked(failed=e.one_line())
    except Exception as e:  # a bug must not stop a training run
        return Checked(failed=f"{type(e).__name__}: {e}")
    # a file that does not parse is refused by the static pass itself, in its own words
    return Checked(tuple(dataclasses.replace(f, fix=None) for f in found if f.code != "CHK001"))


def warn(checked: Checked, said: Iterable[int] = ()) -> None:
    """Print each finding once on stderr, ``flortrain: check: path:line:col: CODE message``. A
    replay hazard (``RPL``) on a line where record itself says why a loop is not memoized
    (``said``: those lines) is not repeated: it is the same reason, from the same plan."""
    if checked.failed:
        print(f"{PREFIX}not run: {checked.failed}", file=sys.stderr)
    lines = set(said)
    seen: set[str] = set()
    for f in checked.findings:
        shown = f.concise()
        if (f.code.startswith("RPL") and f.line in lines) or shown in seen:
            continue
        seen.add(shown)
        print(PREFIX + shown, file=sys.stderr)
