"""The side-effect audit (runtime/audit.py): state a loop changes in place that its static
changeset does not name. Each shape below would replay wrong with ``diff`` passing if it were
checkpointed. Record sees the change in the loop's first instance and stops checkpointing that
loop, so the replay runs it and prints what ``python`` prints. Shapes whose
changes the changeset does hold must stay memoized. Shapes of Python state (sets, callables,
arrays, module globals, iterators) train a list of weights in plain Python: a torch process costs
about two CPU-seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.protocol import (
    PY_TOY_PRELUDE,
    PY_TOY_STEP,
    record_and_replay_match_plain,
    replay_matches_plain,
)

EVERY = {"FLORTRAIN_PERIOD": "every"}


def _replayed_and_said(tmp_path: Path, text: str, probe: str, replayed: str, said: str) -> None:
    """The protocol on ``text`` (``replay_matches_plain``), the replay's summary saying
    ``replayed`` (which instances were skipped or executed), and a record saying ``said``."""
    rec, rep = record_and_replay_match_plain(tmp_path, text, probe, EVERY)
    assert replayed in rep.err, rep.err
    assert said in rec.err, rec.err


#: A batch of eight sample indices (8 spaces: inside the memoized loop).
PY_BATCH = """\
        batch = [random.randrange(64) for _ in range(8)]
"""

#: The epoch's end: the probe's place, and the plain run's one line per epoch.
PY_EPOCH_END = """\
    #PROBE
    print(f"epoch {epoch} {loss:.6f}")
"""

#: A ``Linear`` model and its data, for the shapes of torch state.
PRELUDE = """\
import torch

torch.manual_seed(0)
X = torch.randn(64, 4)
Y = X @ torch.tensor([1.0, -2.0, 0.5, 3.0])
model = torch.nn.Linear(4, 1)
"""

OPTIMIZER = "opt = torch.optim.SGD(model.parameters(), lr=0.05)\n"

#: One SGD step on the batch ``idx``, inside the memoized loop (8 spaces).
STEP = """\
        loss = ((model(X[idx]).squeeze(1) - Y[idx]) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

#: :data:`STEP` by hand, for a shape whose subject is not the optimizer (an optimizer imports
#: torch._dynamo, about a CPU-second a process).
HAND_STEP = """\
        loss = ((model(X[idx]).squeeze(1) - Y[idx]) ** 2).mean()
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            model.weight -= 0.05 * model.weight.grad
            model.bias -= 0.05 * model.bias.grad
"""

#: The epoch's end: the probe's place, and the plain run's one line per epoch.
EPOCH_END = """\
    #PROBE
    print(f"epoch {epoch} {loss.item():.6f}")
"""

SET_ADD = (
    PY_TOY_PRELUDE
    + """\
seen = set()
for epoch in range(4):
    for step in range(4):
"""
    + PY_BATCH
    + """\
        for i in batch:
            seen.add(i)              # `add` names a tensor's pure method, but writes a set
"""
    + PY_TOY_STEP
    + PY_EPOCH_END
)


def test_a_set_filled_through_add_is_not_skipped_over(tmp_path: Path) -> None:
    _replayed_and_said(
        tmp_path,
        SET_ADD,
        'print(f"PROBE {epoch} {len(seen)}")',
        "0 block instances skipped, 4 executed",
        "changes `seen` in place through code its changeset does not see into",
    )


CALLABLE = (
    PY_TOY_PRELUDE
    + """\
class Jitter:
    def __init__(self, seed):
        self.rng = random.Random(seed)   # a private stream no global capture holds
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return [v + 0.1 * self.rng.gauss(0.0, 1.0) for v in x]


jitter = Jitter(123)
for epoch in range(4):
    for step in range(4):
"""
    + PY_BATCH
    + """\
        loss = 0.0
        for i in batch:
            xb = jitter(data[i])
            err = sum(w * x for w, x in zip(weight, xb)) - target[i]
            loss += err * err / len(batch)
            for k in range(4):
                weight[k] -= 0.02 * err * xb[k]
"""
    + PY_EPOCH_END
)


def test_a_callable_object_with_its_own_stream_is_not_skipped_over(tmp_path: Path) -> None:
    probe = 'print(f"PROBE {epoch} {jitter.calls} {jitter.rng.getstate()[1][:3]}")'
    rep = replay_matches_plain(tmp_path, CALLABLE, probe, EVERY)
    assert "0 block instances skipped, 4 executed" in rep.err, rep.err


MAIN_BODY = (
    PY_TOY_PRELUDE
    + """\
import numpy as np

acc = np.zeros(4)
for epoch in range(6):
    for step in range(4):
"""
    + PY_BATCH
    + PY_TOY_STEP
    + """\
    np.add(acc, weight, acc)   # a positional `out`, in the epoch body
"""
    + PY_EPOCH_END
)


def test_a_main_loop_that_changes_an_array_in_place_is_not_jumped_over(tmp_path: Path) -> None:
    """The change is in the main loop's body, outside the memoized loop: the inner loop stays
    memoized, but no iteration boundary is checkpointed, so no replay jumps over the epochs
    that filled ``acc``."""
    probe = 'if epoch == 5: print("PROBE", acc.round(6).tolist())'
    rec, rep = record_and_replay_match_plain(tmp_path, MAIN_BODY, probe, EVERY)
    assert "iterations jumped over" not in rep.err, rep.err
    assert "changes `acc` in place" in rec.err, rec.err


COVERED = (
    PRELUDE
    + OPTIMIZER
    + """\
history = []
log = {"history": history, "runs": 1}   # reaches state the changeset holds
w = model.weight                        # an alias of a parameter the optimizer updates
for epoch in range(4):
    for step in range(4):
        idx = torch.randint(0, 64, (8,))
"""
    + STEP
    + """\
        history.append(loss.item())
    #PROBE
    print(f"epoch {epoch} {loss.item():.6f} {w.sum().item():.6f}")
"""
)


def test_changes_the_changeset_holds_keep_the_loop_memoized(tmp_path: Path) -> None:
    """No false alarm: a dict reaching a list the loop appends to (in its changeset), and a
    name for a parameter (the alias watch's)."""
    probe = "print(f\"PROBE {epoch} {len(log['history'])} {w.sum().item():.6f}\")"
    rec, rep = record_and_replay_match_plain(tmp_path, COVERED, probe, EVERY)
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err
    assert "in place through code" not in rec.err, rec.err


HELPERS = """\
COUNTS = {"steps": 0}
calls = 0


def step_fn(weight, xb, yb):
    global calls
    calls += 1
    COUNTS["steps"] += 1
    err = sum(w * x for w, x in zip(weight, xb)) - yb
    return [w - 0.02 * err * x for w, x in zip(weight, xb)], err * err
"""

PROJECT_MODULE = (
    PY_TOY_PRELUDE
    + """\
import helpers
from helpers import step_fn
for epoch in range(4):
    for step in range(4):
        i = random.randrange(64)
        weight, loss = step_fn(weight, data[i], target[i])
"""
    + PY_EPOCH_END
)


def test_a_helper_module_counting_in_its_own_globals_is_not_skipped_over(tmp_path: Path) -> None:
    """``step_fn`` in the project's ``helpers.py`` changes that module's ``COUNTS`` and rebinds
    its ``calls``: no name of the loop's frame reaches them (``from helpers import step_fn``),
    so the audit walks the project modules' globals too."""
    (tmp_path / "helpers.py").write_text(HELPERS)
    _replayed_and_said(
        tmp_path,
        PROJECT_MODULE,
        'print(f"PROBE {epoch} {helpers.calls} {helpers.COUNTS}")',
        "0 block instances skipped, 4 executed",
        "changes `helpers`, `helpers.COUNTS` in place",
    )


LATE_SYNC = (
    PRELUDE
    + """\
from torch.nn.utils import parameters_to_vector, vector_to_parameters
target = torch.nn.Linear(4, 1)
for epoch in range(6):
    for step in range(4):
        idx = torch.randint(0, 64, (8,))
"""
    + HAND_STEP
    + """\
        if epoch >= 3 and step == 3:
            vector_to_parameters(parameters_to_vector(model.parameters()).detach(), target.parameters())
    #PROBE
    print(f"epoch {epoch} {loss.item():.6f}")
"""
)


def test_a_module_a_loop_starts_changing_late_is_learned_then(tmp_path: Path) -> None:
    """A target network synced from epoch 3 on through ``vector_to_parameters``: the alias watch
    watches only the first two instances, so later checkpoints would leave ``target`` out and a
    skipped instance would restore without it. A light watch (memory and version
    counter of the modules no checkpoint holds) learns it at the instance that changes it, and
    the loop stays memoized."""
    probe = (
        'print("PROBE", epoch, [round(v, 5) for v in target.weight.detach().flatten().tolist()])'
    )
    rec, rep = record_and_replay_match_plain(tmp_path, LATE_SYNC, probe, EVERY)
    assert "6 block instances skipped, 0 executed" in rep.err, rep.err
    assert (
        "changed a Linear (registry #" in rec.err
        and "checkpointed with the block from now on" in rec.err
    ), rec.err


ISLICE = (
    PY_TOY_PRELUDE
    + """\
import itertools
batches = [[random.randrange(64) for _ in range(8)] for _ in range(40)]
stream = iter(batches)
for epoch in range(4):
    for batch in itertools.islice(stream, 6):
"""
    + PY_TOY_STEP
    + """\
    held_out = next(stream)
"""
    + PY_EPOCH_END
)


def test_an_iterator_a_loop_consumes_through_islice_is_not_skipped_over(tmp_path: Path) -> None:
    """``itertools.islice(stream, 6)`` advances ``stream``, which no rule sees: a skipped
    instance would leave it where the prologue did, so the next executed one would train on the
    first batches again. The audit images a sequence iterator by its
    position."""
    _replayed_and_said(
        tmp_path,
        ISLICE,
        'print("PROBE", epoch, held_out)',
        "0 block instances skipped, 4 executed",
        "iterates `stream`, an iterator made before it",
    )


#: A generator made before the loop, advanced by the loop's own header: no rule names it, and no
#: image can compare a generator's position. The line after the main loop shows where it is.
GENERATOR = (
    PY_TOY_PRELUDE
    + """\
import itertools
def batches():
    while True:
        yield [random.randrange(64) for _ in range(8)]
gen = batches()
for epoch in range(4):
    HEADER
"""
    + PY_TOY_STEP
    + PY_EPOCH_END
    + """\
print("after", next(gen))
"""
)


@pytest.mark.parametrize(
    "header",
    [
        "for batch in itertools.islice(gen, 3):",
        "for _, batch in zip(range(3), gen):",
        "for batch in gen:\n        if batch[0] < 8: break",
    ],
    ids=["islice", "zip", "direct"],
)
def test_a_generator_the_loop_header_advances_is_not_skipped_over(
    tmp_path: Path, header: str
) -> None:
    """``for batch in itertools.islice(gen, 3)`` advances ``gen``. Checkpointed without it, a
    skipped instance would leave ``gen`` where it was, and the line after the main loop would
    print another batch (``diff`` exit 1). Record sees, at the loop's entry, that the
    iterator it advances is held by a name, and stops checkpointing the loop."""
    text = GENERATOR.replace("HEADER", header)
    if "break" in header:  # the step goes after the break, inside the loop
        text = text.replace("        if batch[0] < 8: break\n", "").replace(
            PY_TOY_STEP, PY_TOY_STEP + "        if batch[0] < 8:\n            break\n"
        )
    _replayed_and_said(
        tmp_path,
        text,
        'print("PROBE", epoch, weight)',
        "0 block instances skipped, 4 executed",
        "iterates `gen`, an iterator made before it",
    )


LOADER_AND_LISTS = (
    PRELUDE
    + """\
from torch.utils.data import DataLoader, TensorDataset
loader = DataLoader(TensorDataset(torch.arange(64)), batch_size=8, shuffle=True)
chunks = [torch.randint(0, 64, (8,)) for _ in range(3)]
for epoch in range(4):
    for i, ((idx,), extra) in enumerate(zip(loader, chunks)):
"""
    + HAND_STEP
    + EPOCH_END
)


def test_iterators_made_by_the_header_from_containers_stay_memoized(tmp_path: Path) -> None:
    """``enumerate(zip(loader, chunks))`` makes iterators of its own from a DataLoader and a list:
    no name holds them, so nothing outside the loop is advanced and every instance is skipped."""
    rep = replay_matches_plain(
        tmp_path, LOADER_AND_LISTS, 'print("PROBE", epoch, model.weight.sum().item())', EVERY
    )
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err


def test_a_module_the_registry_does_not_know_is_audited_one_it_knows_is_the_watchs() -> None:
    """A module built with ``__new__`` and given its attributes by hand passes neither
    ``__init__`` nor ``__setstate__``, so the alias watch does not have it: the audit images it
    as a plain object, and a change to its weights is named. A module the registry knows stays
    the watch's (it would be compared twice, and a change the watch learns is no reason to stop
    the loop's checkpoints)."""
    import copy

    import torch

    from flortrain.runtime import audit
    from flortrain.runtime.registry import Registry

    reg = Registry()
    reg.install()
    try:
        net = torch.nn.Linear(3, 1)
        twin = torch.nn.Linear.__new__(torch.nn.Linear)
        twin.__dict__.update(copy.deepcopy(net.__dict__))
        known = copy.deepcopy(net)
        assert reg.id_of(twin) is None and reg.id_of(known) is not None
        roots = {"net": net, "twin": twin, "known": known}

        def watched(o: object) -> bool:
            return reg.id_of(o) is not None

        before = audit.Image(roots, watched=watched)
        with torch.no_grad():
            twin.weight.add_(1.0)
            known.weight.add_(1.0)
        after = audit.Image(roots, watched=watched)
        trained = audit.trained_addresses([m for _, m in reg.root_modules()], [], torch)
        assert audit.changed(before, after, set(), trained) == ["twin"]
    finally:
        reg.uninstall()
