"""One script in, instrumented code out: the static pass end to end (no torch)."""

from __future__ import annotations

from dataclasses import dataclass
from types import CodeType

from flortrain.errors import FlortrainError, Located
from flortrain.static.analysis import analyse
from flortrain.static.linemap import compile_mapped
from flortrain.static.plan import Plan
from flortrain.static.source import Source, parse
from flortrain.static.transform import Instrumentation, transform


@dataclass(frozen=True)
class Instrumented:
    plan: Plan
    code_text: str


def for_record(source: Source) -> Instrumented:
    plan = analyse(source)
    inst = Instrumentation(
        blocks={b.span.line: b for b in plan.blocks},
        mains={m.span.line: m for m in plan.main_loops},
    )
    return Instrumented(plan, transform(source, inst))


def instrument_file(path: str, text: str | None = None) -> Instrumented:
    return for_record(parse(path, text))


def compile_for(path: str, code_text: str, disk_text: str) -> CodeType:
    """Compile instrumented code so frames point at ``path`` as it is on disk."""
    try:
        code = compile_mapped(code_text, disk_text, path)
    except SyntaxError as e:  # a transform bug must still be one line, not a traceback
        raise FlortrainError(
            f"instrumented code does not compile ({e.msg}); please report this",
            Located(path, e.lineno or 0, e.offset or 0),
            "FT003",
        ) from None
    assert isinstance(code, CodeType)
    return code
