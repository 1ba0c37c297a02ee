"""Files a training loop writes and the script reads back after it (``torch.save`` then
``torch.load``): what a replay that skips the write does with them."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from flortrain.check import plan_facts
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.expressions import argument, dotted
from flortrain.static.loops import loop_body
from flortrain.static.program import Program

#: functions that write a file, and which positional argument (or keyword) is its path
_WRITERS = {
    "torch.save": (1, "f"),
    "numpy.save": (0, "file"),
    "numpy.savez": (0, "file"),
    "numpy.savetxt": (0, "fname"),
    "pickle.dump": (1, "file"),
    "json.dump": (1, "fp"),
    "torchvision.utils.save_image": (1, "fp"),
    "shutil.copy": (1, "dst"),
    "shutil.copyfile": (1, "dst"),
}
_READERS = {
    "torch.load": (0, "f"),
    "numpy.load": (0, "file"),
    "numpy.loadtxt": (0, "fname"),
    "pickle.load": (0, "file"),
    "json.load": (0, "fp"),
}


class FileReadBack(Rule):
    code = f"{Family.REPLAY}006"
    name = "file-read-back"
    severity = Severity.WARNING
    message = "file written inside the training loop and read back after it"
    hint = "write it under the working directory; for a fast parallel replay keep the best state in memory"
    doc = (
        "A replay skips memoized loops and jumps over main-loop iterations, so a file a skipped"
        " stretch wrote (`torch.save(best, 'best.pt')` on improvement) would be missing, or"
        " stale, when the script reads it back after the loop (`torch.load('best.pt')`). Record"
        " keeps each file the script writes as every checkpoint finds it, and a replay's restore"
        " puts the files back as they were there, so the read sees the record's file. Two"
        " limits: a file outside the working directory, or over 64 MB, is not put back, and a"
        " replay whose script reads such a file is refused up front (`FT034`, naming it); and a"
        " parallel replay of a script that reads back a file it writes runs serially (its"
        " workers share one directory). The static pass matches the write and the read by the"
        " text of the path expression (`path`, `args.save`, `'best.pt'`); it knows neither the"
        " working directory record will run in nor the file's size, and a path spelt two ways"
        " (`f'ckpt_{epoch}.pt'`, then the best epoch's) is not matched."
    )
    valid = (
        Valid(
            """
            import torch
            for epoch in range(3):
                for x in data:
                    model(x).backward()
                torch.save(model.state_dict(), f"ckpt_{epoch}.pt")
            """
        ),
        Valid(
            """
            import torch
            model.load_state_dict(torch.load("init.pt"))
            for epoch in range(3):
                for x in data:
                    model(x).backward()
            """
        ),
    )
    invalid = (
        Invalid(
            """
            import torch
            best = None
            for epoch in range(3):
                for x in data:
                    loss = model(x)
                    loss.backward()
                if best is None or loss.item() < best:
                    best = loss.item()
                    torch.save(model.state_dict(), "best.pt")
            model.load_state_dict(torch.load("best.pt"))
            """,
            line=9,
            col=9,
        ),
        Invalid(
            """
            import torch
            for epoch in range(3):
                for x in data:
                    model(x).backward()
                with open(args.save, "wb") as f:
                    torch.save(model, f)
            with open(args.save, "rb") as f:
                model = torch.load(f)
            """,
            line=5,
            col=10,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        p = plan_facts.plan(unit)
        prog = plan_facts.program(unit)
        if p is None or prog is None:
            return
        for m in plan_facts.training_mains(p).values():
            loop = plan_facts.loop_at(prog, m.span)
            if loop is None:
                continue
            scope = prog.loop_scope[loop]
            inside = list(prog.calls_in([loop]))
            for q in sorted(prog.reachable(list(loop_body(loop)), scope)):
                inside.extend(prog.calls_in(list(prog.scopes[q].body)))
            written = {id(c) for c in inside}
            handles = _file_handles(prog)
            reads: dict[str, int] = {}
            for call in unit.calls:
                if id(call) in written:
                    continue
                path = _path(unit, call, _READERS, read=True)
                if path is not None and path not in handles:
                    reads.setdefault(path, unit.where(call)[0])
            if not reads:
                continue
            for call in inside:
                path = _path(unit, call, _WRITERS, read=False)
                if path is not None and path in reads:
                    yield Hit(
                        call,
                        message=(
                            f"`{path}` is written inside main loop {m.id} and read back at line"
                            f" {reads[path]}: a replay puts it back as the record's checkpoints"
                            " found it, unless it lies outside the working directory or over"
                            " 64 MB (then the replay is refused, FT034); a parallel replay runs"
                            " serially"
                        ),
                    )


def _file_handles(prog: Program) -> set[str]:
    """Names bound to ``open(..)`` (``with open(p, "wb") as f``): the path is ``open``'s."""
    return {
        name
        for s in prog.scopes.values()
        for name, values in s.assigned.items()
        if any(isinstance(v, cst.Call) and dotted(v.func) == "open" for v in values)
    }


def _path(unit: Unit, call: cst.Call, table: dict[str, tuple[int, str]], read: bool) -> str | None:
    """The path expression ``call`` writes (or reads), as text."""
    names = unit.called(call)
    if "open" in names or "builtins.open" in names or "io.open" in names:
        mode = argument(call, "mode", 1)
        text = unit.module.code_for_node(mode).strip("'\"rb") if mode is not None else ""
        writes = mode is not None and any(ch in text for ch in "wax+")
        if writes == read:
            return None
        target = argument(call, "file", 0)
    else:
        key = next((n for n in names if n in table), None)
        if key is None:
            return None
        pos, keyword = table[key]
        target = argument(call, keyword, pos)
    return unit.module.code_for_node(target) if target is not None else None
