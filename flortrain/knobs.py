"""Every tunable in one place (torchsnapshot's lesson): defaults, and the environment variables
that override them."""

from __future__ import annotations

import os

from flortrain.errors import FlortrainError

#: Default store directory, relative to the working directory.
STORE_DIRNAME = ".flortrain"
STORE_ENV = "FLORTRAIN_STORE"

#: Overhead tolerance ε of the Joint Invariant (Flor Eq. 4). 1/15 as in the paper.
EPSILON_ENV = "FLORTRAIN_EPSILON"
DEFAULT_EPSILON = 1.0 / 15.0

#: Restore/materialize cost ratio c (Flor Eq. 3); 1.38 is the paper's measured average, refined
#: from observed restore times once a replay has run.
DEFAULT_RESTORE_RATIO = 1.38

#: How many first instances of each block are watched for state mutated through aliases the
#: changeset rules cannot see (live modules and optimizers outside the changeset).
ALIAS_WATCH_INSTANCES = 2

#: Captured stdout lines are committed to SQLite in batches of this many (and at exit).
LOG_BATCH = 256


#: "adaptive" (Flor's Eq. 4, the default) or "every" (checkpoint every block instance).
PERIOD_ENV = "FLORTRAIN_PERIOD"
PERIODS = ("adaptive", "every")


def epsilon() -> float:
    """The overhead tolerance ε, validated: a positive number."""
    raw = os.environ.get(EPSILON_ENV)
    if raw is None:
        return DEFAULT_EPSILON
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise FlortrainError(f"{EPSILON_ENV}={raw!r} must be a positive number (default 1/15)", code="FT050")
    return value


def period() -> str:
    raw = os.environ.get(PERIOD_ENV, "adaptive")
    if raw not in PERIODS:
        raise FlortrainError(f"{PERIOD_ENV}={raw!r} must be one of {', '.join(PERIODS)}", code="FT050")
    return raw


def validate() -> None:
    """Check every environment knob before a run starts, so a typo fails in one line up front."""
    epsilon()
    period()
