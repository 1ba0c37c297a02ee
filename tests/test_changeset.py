"""The changeset of a memoized loop: every rule's own cases (``ChangesetRule.cases``, in
``flortrain.static.changeset.rules``), and what no single rule owns: the rule numbers and lines
recorded, callee and method main loops, refusals located in the plan, loops with nothing to
memoize.
"""

from __future__ import annotations

from textwrap import dedent

import pytest

from flortrain.static.analysis import analyse
from flortrain.static.changeset.docs import PAGE, render
from flortrain.static.changeset.rule import Case, ChangesetRule, Refused
from flortrain.static.changeset.rules import all_rules
from flortrain.static.plan import Block, Plan, Restore
from flortrain.static.source import parse

P = Restore.IN_PLACE
R = Restore.REBOUND
RULES = all_rules()


def plan_of(src: str) -> Plan:
    return analyse(parse("train.py", dedent(src)))


def only_block(plan: Plan) -> Block:
    assert len(plan.main_loops) == 1, plan.explain()
    assert not plan.refused, plan.explain()
    assert len(plan.blocks) == 1, plan.explain()
    return plan.blocks[0]


def changeset(src: str) -> set[tuple[str, Restore]]:
    return {(c.expr, c.restore) for c in only_block(plan_of(src)).changeset}


def check(src: str, expected: object) -> None:
    plan = plan_of(src)
    if isinstance(expected, Refused):
        assert len(plan.main_loops) == 1, plan.explain()
        assert not plan.blocks, plan.explain()
        assert len(plan.refused) == 1, plan.explain()
        assert expected.reason in plan.refused[0].reason, plan.explain()
    else:
        assert isinstance(expected, set | frozenset), expected
        block = only_block(plan)
        assert {(c.expr, c.restore) for c in block.changeset} == expected, plan.explain()
        assert len(block.changeset) == len(expected), "duplicate changeset entries"


def _cases() -> list[object]:
    return [pytest.param(r, c, id=f"{r.name}-{c.id}") for r in RULES for c in r.cases]


@pytest.mark.parametrize(("rule", "c"), _cases())
def test_rule_case(rule: type[ChangesetRule], c: Case) -> None:
    check(c.source, c.expected)


def test_every_rule_is_described_and_has_cases() -> None:
    numbers = [r.number for r in RULES if r.number is not None]
    assert numbers == [0, 1, 2, 3, 4, 5], "Table 2's rules, in precedence order"
    names = [r.name for r in RULES]
    assert len(set(names)) == len(names), names
    ids = [c.id for r in RULES for c in r.cases]
    assert len(set(ids)) == len(ids), "case ids are unique across the rules"
    for r in RULES:
        assert r.cases and r.pattern and r.change and r.doc, r.name
        module = r.__module__.rsplit(".", 1)[-1]
        assert module == r.name.replace("-", "_"), (module, r.name)


def test_docs_list_every_rule_from_its_module() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert render(page) == page, "stale: python -m flortrain.static.changeset.docs"
    for r in RULES:
        assert f"\n### {r.name}\n" in page and f"(#{r.name})" in page, r.name


# -- Table 2 ---------------------------------------------------------------------------------------


def test_rule_numbers_and_lines_are_recorded() -> None:
    block = only_block(
        plan_of("""
        for epoch in range(3):
            for b in loader:
                out = model.forward(b)
                y = compute(b)
                z = y
                opt.step()
        print(out, y, z)
    """)
    )
    assert {(c.expr, c.rule, c.line) for c in block.changeset} == {
        ("model", 1, 4),
        ("out", 1, 4),
        ("y", 2, 5),
        ("z", 3, 6),
        ("opt", 4, 7),
    }


# -- hooks, callees, methods, globals ---------------------------------------------------------


def test_probe_inside_a_hook_reaches_it() -> None:
    plan = plan_of("""
        acts = {}

        def hook(mod, inp, out):
            acts["fc"] = out

        model.register_forward_hook(hook)
        for epoch in range(3):
            for b in loader:
                out = model(b)
    """)
    assert "hook" in only_block(plan).reaches


def test_callee_loop_changeset_names_its_parameters() -> None:
    """`train_one_epoch(model, loader, opt)` with the batch loop in the callee: the block lives in
    the callee and its changeset is in the callee's own names."""
    plan = plan_of("""
        def train_one_epoch(model, loader, opt):
            total = 0.0
            for b in loader:
                opt.zero_grad()
                loss = model(b)
                loss.backward()
                opt.step()
                total += loss.item()
            return total

        def main():
            for epoch in range(3):
                avg = train_one_epoch(net, dl, optimizer)
                print(avg)

        main()
    """)
    block = only_block(plan)
    assert block.function == "train_one_epoch"
    assert block.span.line == 4
    assert plan.main_loops[0].function == "main"
    assert {(c.expr, c.restore) for c in block.changeset} == {("opt", P), ("total", R)}
    assert {(c.expr, c.rule) for c in block.changeset} == {("opt", 4), ("total", 2)}


def test_method_main_loop_and_self_changes() -> None:
    """`self.fit()` -> `self.train_epoch()`: the block is the method's loop, its changeset is on
    `self`'s attributes, and `self.global_step += 1` is a rebound attribute."""
    plan = plan_of("""
        class Trainer:
            def __init__(self, model, loader):
                self.optimizer = make(model)
                self.loader = loader
                self.global_step = 0

            def train_epoch(self):
                for b in self.loader:
                    self.optimizer.zero_grad()
                    self.optimizer.step()
                    self.global_step += 1

            def fit(self, epochs):
                for epoch in range(epochs):
                    self.train_epoch()

        Trainer(net, dl).fit(3)
    """)
    block = only_block(plan)
    assert plan.main_loops[0].function == "Trainer.fit"
    assert block.function == "Trainer.train_epoch"
    assert {(c.expr, c.restore) for c in block.changeset} == {
        ("self.optimizer", P),
        ("self.global_step", R),
    }


def test_global_rebound_inside_a_function_is_flagged_global() -> None:
    """A global rebound from inside a function must be restored through globals(); a nonlocal one
    must not (it lives in the enclosing function)."""
    glob = only_block(
        plan_of("""
        step = 0

        def main():
            global step
            for epoch in range(3):
                for b in loader:
                    step += 1

        main()
    """)
    )
    assert [(c.expr, c.restore, c.is_global) for c in glob.changeset] == [("step", R, True)]
    nonloc = only_block(
        plan_of("""
        def main():
            total = 0

            def inner():
                nonlocal total
                for epoch in range(3):
                    for b in loader:
                        total += 1

            inner()
            return total
    """)
    )
    assert [(c.expr, c.restore, c.is_global) for c in nonloc.changeset] == [("total", R, False)]


def test_one_line_callee_body_is_analysed() -> None:
    """A one-line function body (`def log(v): hist.append(v)`) has positions like any other."""
    assert changeset("""
        hist = []
        def log(v): hist.append(v)
        for epoch in range(3):
            for b in loader: log(b)
    """) == {("hist", P)}


# -- refusals of the loop as a whole -------------------------------------------------------------


def test_return_in_callee_is_fine_and_break_in_loop_is_fine() -> None:
    assert changeset("""
        def step(opt):
            opt.step()
            return 1

        for epoch in range(3):
            for b in loader:
                if step(optimizer):
                    break
    """) == {("optimizer", P)}


def test_refused_loop_is_located_and_attributed() -> None:
    plan = plan_of("""
        def main():
            for epoch in range(3):
                for b in loader:
                    mystery(b)
    """)
    (r,) = plan.refused
    assert (r.span.line, r.span.col, r.function, r.main) == (4, 9, "main", "M3")
    assert "line 5" in r.reason
    assert "refused loop in main" in plan.explain()


# -- no-ops: nothing to memoize ------------------------------------------------------------------


def test_no_nested_loop_means_no_main_loop() -> None:
    plan = plan_of("""
        total = 0
        for b in loader:
            total += b
        while total > 0:
            total -= 1
    """)
    assert plan.main_loops == ()
    assert plan.blocks == ()
    assert plan.refused == ()
    assert "no main loop" in plan.explain()


def test_read_only_inner_loop_has_empty_changeset() -> None:
    plan = plan_of("""
        for epoch in range(3):
            for b in loader:
                print(b.mean().item(), len(b))
    """)
    block = only_block(plan)
    assert block.changeset == ()
    assert "changeset: (empty)" in plan.explain()


def test_functions_without_loops_only() -> None:
    plan = plan_of("""
        def f(x):
            return [y for y in x for _ in range(2)]

        print(f([1, 2]))
    """)
    assert (plan.main_loops, plan.blocks, plan.refused) == ((), (), ())
    assert [f.qualname for f in plan.functions] == ["f"]
