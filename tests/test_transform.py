"""The transform: exact instrumented text for small scripts, and the properties every instrumented
script must keep (it compiles, `__future__` imports and the docstring stay first, tracebacks point
at the user's lines, and without a session it behaves exactly like the original)."""

from __future__ import annotations

import contextlib
import io
import traceback
from textwrap import dedent

import pytest

from flortrain.errors import FlortrainError
from flortrain.instrument import instrument_file
from flortrain.static.linemap import compile_mapped, line_map
from flortrain.static.plan import Instrumentation
from flortrain.static.source import parse
from flortrain.static.transform import transform


def src(text: str) -> str:
    return dedent(text).lstrip("\n")


def instrumented(text: str) -> str:
    return instrument_file("train.py", src(text)).code_text


# -- exact before/after ------------------------------------------------------------------------


def test_main_loop_for_block_while_block_and_rebound_names() -> None:
    before = src('''
        """Train."""
        from __future__ import annotations

        total = 0
        for epoch in range(2):
            for b in [1, 2, 3]:
                total += b
            k = 0
            while k < 2: k += 1
            print(epoch, total, k)
    ''')
    after = src('''
        """Train."""
        from __future__ import annotations
        import flortrain.runtime as __flortrain__

        total = 0
        __flortrain__.main_enter("M5")
        for epoch in __flortrain__.main_iter("M5", range(2)):
            _flortrain_M5 = __flortrain__.main_iteration("M5", {}, {"epoch": lambda: epoch, "total": lambda: total}, ())
            if _flortrain_M5.jumped():
                if _flortrain_M5.has("epoch"): epoch = _flortrain_M5.value("epoch")
                if _flortrain_M5.has("total"): total = _flortrain_M5.value("total")
            _flortrain_L6 = __flortrain__.block("L6", 6, 7, names={"total": lambda: total})
            for b in _flortrain_L6.iterate([1, 2, 3]):
                total += b
            if _flortrain_L6.end({}, {"total": lambda: total}):
                if _flortrain_L6.has("total"): total = _flortrain_L6.value("total")
            k = 0
            _flortrain_L9 = __flortrain__.block("L9", 9, 9, names={"k": lambda: k})
            while _flortrain_L9.live() and (k < 2): k += 1
            if _flortrain_L9.end({}, {"k": lambda: k}):
                if _flortrain_L9.has("k"): k = _flortrain_L9.value("k")
            if __flortrain__.forward("M5", 10, (), ()):
                print(epoch, total, k)
        __flortrain__.main_exit("M5")
    ''')
    assert instrumented(before) == after


def test_in_place_objects_and_globals_in_a_function() -> None:
    before = src("""
        step = 0


        def main(loader, opt):
            global step
            # the epoch loop
            for epoch in range(2):
                for b in loader:
                    opt.step()
                    step += 1
    """)
    after = src("""
        import flortrain.runtime as __flortrain__
        step = 0


        def main(loader, opt):
            global step
            # the epoch loop
            __flortrain__.main_enter("M7")
            for epoch in __flortrain__.main_iter("M7", range(2)):
                _flortrain_M7 = __flortrain__.main_iteration("M7", {"opt": lambda: opt}, {"step": lambda: step, "epoch": lambda: epoch}, ())
                if _flortrain_M7.jumped():
                    if _flortrain_M7.has("step"): globals()["step"] = _flortrain_M7.value("step")
                    if _flortrain_M7.has("epoch"): epoch = _flortrain_M7.value("epoch")
                _flortrain_L8 = __flortrain__.block("L8", 8, 10, objects={"opt": lambda: opt}, names={"step": lambda: step})
                for b in _flortrain_L8.iterate(loader):
                    opt.step()
                    step += 1
                if _flortrain_L8.end({"opt": lambda: opt}, {"step": lambda: step}):
                    if _flortrain_L8.has("step"): globals()["step"] = _flortrain_L8.value("step")
            __flortrain__.main_exit("M7")
    """)
    assert instrumented(before) == after


def test_in_place_only_block_has_no_restore_assignment() -> None:
    out = instrumented("""
        for epoch in range(2):
            for b in loader:
                opt.step()
    """)
    assert '    _flortrain_L2.end({"opt": lambda: opt}, {})\n' in out
    assert "_flortrain_L2.value(" not in out


def test_probe_wrapper() -> None:
    source = parse(
        "train.py",
        src("""
        total = 0
        for epoch in range(2):
            for b in [1, 2]:
                total += b
                print("inner", total)
            print("outer", epoch)
    """),
    )
    out = transform(source, Instrumentation(probes={5: 1, 6: 2}))
    assert out == src("""
        import flortrain.runtime as __flortrain__
        total = 0
        for epoch in range(2):
            for b in [1, 2]:
                total += b
                if __flortrain__.probing():
                    with __flortrain__.probe(1):
                        print("inner", total)
            if __flortrain__.probing():
                with __flortrain__.probe(2):
                    print("outer", epoch)
    """)


def test_probe_that_is_a_compound_statement_or_a_def() -> None:
    source = parse(
        "train.py",
        src("""
        x = 1
        if x:
            print(x)
        def show(v):
            print(v)
        show(x)
    """),
    )
    out = transform(source, Instrumentation(probes={2: 1, 4: 2}))
    assert out == src("""
        import flortrain.runtime as __flortrain__
        x = 1
        if __flortrain__.probing():
            if x:
                with __flortrain__.probe(1):
                    print(x)
        if __flortrain__.probing():
            with __flortrain__.probe(2):
                def show(v):
                    print(v)
        show(x)
    """)


def test_probe_guard_outside_isolation_only_when_it_only_reads() -> None:
    """A test that only reads values runs outside isolation (isolation costs more than a small
    training step, and the test is false on most iterations). One that calls a function could
    draw random numbers, and an `else:` branch is probe code too: both stay inside."""
    source = parse(
        "train.py",
        src("""
        for i in range(10):
            if i % 4 == 0 and cfg.log: print(i)  # every 4
            if random.random() < 0.1:
                print(i)
            if i > 5:
                print("late")
            else:
                print("early")
    """),
    )
    out = transform(source, Instrumentation(probes={2: 1, 3: 2, 5: 3}))
    assert out == src("""
        import flortrain.runtime as __flortrain__
        for i in range(10):
            if __flortrain__.probing():
                if i % 4 == 0 and cfg.log:
                    with __flortrain__.probe(1):
                        print(i)  # every 4
            if __flortrain__.probing():
                with __flortrain__.probe(2):
                    if random.random() < 0.1:
                        print(i)
            if __flortrain__.probing():
                with __flortrain__.probe(3):
                    if i > 5:
                        print("late")
                    else:
                        print("early")
    """)


def test_probe_on_an_elif_is_refused_not_miscompiled() -> None:
    """Wrapping an `elif` in a `with` would detach it from its `if` chain and change what runs."""
    source = parse(
        "train.py",
        src("""
        if a:
            x = 1
        elif b:
            x = 2
    """),
    )
    with pytest.raises(ValueError, match=r"not found at lines \[3\]"):
        transform(source, Instrumentation(probes={3: 1}))


def test_unknown_instrumentation_point_is_an_error() -> None:
    source = parse("train.py", "x = 1\n")
    with pytest.raises(ValueError, match=r"not found at lines \[7\]"):
        transform(source, Instrumentation(probes={7: 1}))


def test_nothing_to_instrument_only_adds_the_import() -> None:
    text = src('''
        #!/usr/bin/env python
        # -*- coding: utf-8 -*-
        """Doc."""
        from __future__ import annotations
        from __future__ import division

        x = [i for i in range(3)]
        for i in x:
            print(i)
    ''')
    out = instrument_file("train.py", text).code_text
    assert out == text.replace(
        "from __future__ import division\n",
        "from __future__ import division\nimport flortrain.runtime as __flortrain__\n",
    )


# -- properties --------------------------------------------------------------------------------

SCRIPTS = {
    "functions": """
        def train_one_epoch(loader, log):
            total = 0
            for b in loader:
                total += b
                log.append(total)
            return total

        def main():
            log = []
            for epoch in range(3):
                t = train_one_epoch([epoch, 1, 2], log)
                print(epoch, t, log[-1])

        if __name__ == "__main__":
            main()
    """,
    "while-and-break": """
        step = 0
        epoch = 0
        while epoch < 3:
            i = 0
            while True:
                i += 1
                step += i
                if i > epoch:
                    break
            epoch += 1
            print(epoch, i, step)
    """,
    "class-and-closure": """
        class Trainer:
            def __init__(self):
                self.global_step = 0
                self.hist = []

            def train_epoch(self, data):
                for x in data:
                    self.global_step += 1
                    self.hist.append(x * self.global_step)

            def fit(self, n):
                for epoch in range(n):
                    self.train_epoch(range(epoch + 2))
                    print(epoch, self.global_step, sum(self.hist))

        def main():
            seen = []
            count = 0

            def note(v):
                nonlocal count
                count += 1
                seen.append(v)

            for epoch in range(2):
                for b in "ab":
                    note(b)
                print(epoch, count, "".join(seen))
            Trainer().fit(3)

        main()
    """,
    "one-line-bodies": """
        acc = []
        def add(v): acc.append(v)
        for e in range(3):
            for b in range(e): add(b)
            while len(acc) > 4: acc.pop(0)
            print(e, acc)
    """,
    "for-else-and-refused": """
        def search(xs, t):
            for epoch in range(2):
                for x in xs:
                    if x == t:
                        print("found", x, epoch)
                        break
                else:
                    print("missing", t, epoch)

        search([1, 2, 3], 2)
        search([1, 2, 3], 5)
    """,
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_instrumented_code_compiles_and_keeps_first_statements(name: str) -> None:
    text = '"""Module docstring."""\nfrom __future__ import annotations\n' + src(SCRIPTS[name])
    result = instrument_file(f"{name}.py", text)
    code = result.code_text
    compile(code, f"{name}.py", "exec", dont_inherit=True)
    lines = code.splitlines()
    assert lines[:3] == [
        '"""Module docstring."""',
        "from __future__ import annotations",
        "import flortrain.runtime as __flortrain__",
    ]
    # every block and main loop of the plan is in the code
    for b in result.plan.blocks:
        assert f'__flortrain__.block("{b.id}", {b.span.line}, {b.span.end_line}' in code
    for m in result.plan.main_loops:
        assert f'__flortrain__.main_enter("{m.id}")' in code


def _run(code: object, filename: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {"__name__": "__main__", "__file__": filename})
    return out.getvalue()


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_instrumented_code_without_a_session_behaves_like_the_original(name: str) -> None:
    text = src(SCRIPTS[name])
    result = instrument_file(f"{name}.py", text)
    assert result.plan.main_loops, "each script must exercise the instrumentation"
    expected = _run(compile(text, f"{name}.py", "exec"), f"{name}.py")
    assert expected  # the scripts print: equal output means something
    assert _run(compile(result.code_text, f"{name}.py", "exec"), f"{name}.py") == expected
    assert _run(compile_mapped(result.code_text, text, f"{name}.py"), f"{name}.py") == expected


def test_every_script_has_memoized_blocks_or_refusals() -> None:
    kinds = {
        name: (bool(r.plan.blocks), bool(r.plan.refused))
        for name, r in ((n, instrument_file(f"{n}.py", src(t))) for n, t in SCRIPTS.items())
    }
    assert kinds["functions"] == (True, False)
    assert kinds["while-and-break"] == (True, False)
    assert kinds["class-and-closure"] == (True, False)
    assert kinds["for-else-and-refused"] == (False, True)


# -- line mapping --------------------------------------------------------------------------------

RAISES = """
    import math

    def helper(v):
        return math.sqrt(v)

    total = 0
    for epoch in range(3):
        for b in [4, 1, 0, -1]:
            total += helper(b)
            if b < 0:
                raise ValueError(f"negative batch {b}")
        print(total)
"""


def _last_frame(
    code: object, filename: str, error: type[Exception] = ValueError
) -> traceback.FrameSummary:
    with pytest.raises(error) as info:
        _run(code, filename)
    return traceback.extract_tb(info.value.__traceback__)[-1]


def test_traceback_points_at_the_original_line() -> None:
    text = src(RAISES).replace(
        '            if b < 0:\n                raise ValueError(f"negative batch {b}")\n', ""
    )
    result = instrument_file("train.py", text)
    assert result.plan.blocks
    frame = _last_frame(compile_mapped(result.code_text, text, "train.py"), "train.py")
    assert frame.filename == "train.py"
    assert frame.name == "helper"
    assert frame.lineno == 4  # `return math.sqrt(v)` (math domain error on -1)
    assert text.splitlines()[frame.lineno - 1].strip() == "return math.sqrt(v)"


def test_traceback_from_inside_a_memoized_loop_points_at_the_original_line() -> None:
    text = src(RAISES).replace("helper(b)", "b")
    result = instrument_file("train.py", text)
    assert [b.span.line for b in result.plan.blocks] == [8]
    frame = _last_frame(compile_mapped(result.code_text, text, "train.py"), "train.py")
    assert frame.lineno == 11
    assert text.splitlines()[10].strip() == 'raise ValueError(f"negative batch {b}")'
    # unmapped, the instrumented code would have pointed somewhere else
    plain = _last_frame(compile(result.code_text, "train.py", "exec"), "train.py")
    assert plain.lineno != 11


def test_traceback_in_repetitive_code_points_at_the_original_line() -> None:
    """Two copies of the same loop body: the rewritten header of the first must not make the diff
    pair the first copy's lines with the second copy (they would all map to the wrong line)."""
    text = src("""
        class Checker:
            def check(self, a, b):
                if a == b == 2:
                    raise ValueError(a)

        def test(self, s):
            dup = []
            for k, g in s:
                for elem in g:
                    self.check(k, elem)
                    dup.append(elem)
            self.check(s, dup)

            for proto in range(3):
                dup = []
                for k, g in s:
                    for elem in g:
                        self.check(k, elem)
                        dup.append(elem)
                self.check(s, dup)

        test(Checker(), [(1, [1]), (2, [2])])
    """)
    result = instrument_file("train.py", text)
    assert [b.span.line for b in result.plan.blocks] == [9, 16]
    with pytest.raises(ValueError) as info:
        _run(compile_mapped(result.code_text, text, "train.py"), "train.py")
    frames = traceback.extract_tb(info.tb)
    assert [(f.name, f.lineno) for f in frames[-3:]] == [
        ("<module>", 22),
        ("test", 10),
        ("check", 4),
    ]


def test_line_map_has_one_entry_per_python_line() -> None:
    """Python ends lines only at \\n, \\r\\n and \\r; a form feed on its own line is not a break."""
    text = (
        "import sys\n\x0c\nfor e in range(2):\n    for b in [1]:\n        x = b\n\x0c\nprint(x)\n"
    )
    code = instrumented(text)
    python_lines = len(code.replace("\r\n", "\n").split("\n")) - 1
    mapping = line_map(text, code)
    assert len(mapping) == python_lines
    assert mapping[code.split("\n").index("print(x)")] == (7, 0)


def test_traceback_inside_a_probe_points_at_the_probe_line() -> None:
    text = src("""
        for epoch in range(2):
            for b in [1, 0]:
                x = b
                print(1 / x)
    """)
    source = parse("train.py", text)
    out = transform(source, Instrumentation(probes={4: 1}))
    frame = _last_frame(compile_mapped(out, text, "train.py"), "train.py", ZeroDivisionError)
    assert frame.lineno == 4
    assert text.splitlines()[3].strip() == "print(1 / x)"


# -- robustness ---------------------------------------------------------------------------------


def test_tab_indented_and_crlf_scripts_compile_and_keep_their_style() -> None:
    tabbed = "for e in range(2):\n\tfor b in [1]:\n\t\tt = b\n\tprint(t)\n"
    out = instrumented(tabbed)
    compile(out, "t.py", "exec")
    assert (
        '\tif _flortrain_L2.end({}, {"t": lambda: t}):\n\t\tif _flortrain_L2.has("t"): t = _flortrain_L2.value("t")\n'
        in out
    )
    crlf = "for e in range(2):\r\n    for b in [1]:\r\n        t = b\r\n    print(t)\r\n"
    out = instrumented(crlf)
    compile(out, "t.py", "exec")
    assert "\n" not in out.replace("\r\n", "")


def test_too_deeply_nested_source_is_a_one_line_refusal() -> None:
    deep = "x = (\n" + "".join(f"    'part{i}'\n" for i in range(3000)) + ")\n"
    with pytest.raises(FlortrainError) as info:
        instrument_file("deep.py", deep)
    assert info.value.code == "FT004"
    assert info.value.one_line() == "deep.py: FT004 too deeply nested for the static pass"


def test_source_too_deep_for_the_compiler_is_a_one_line_refusal() -> None:
    """CPython's compiler has a nesting limit of its own (a 3,000-term ``+`` chain): the
    refusal is FT004, as for the pass's walks, not a RecursionError."""
    deep = "x = " + " + ".join(["'a'"] * 3000) + "\n"
    with pytest.raises(FlortrainError) as info:
        instrument_file("deep.py", deep)
    assert info.value.one_line() == "deep.py: FT004 too deeply nested for the static pass"
