"""Main-loop detection and candidate inner loops (flortrain.static.loops, through the plan).

The main loop is the outermost loop that contains another loop, lexically or through calls to
module-local functions and methods; its candidates are the outermost loops its body runs. Each case
asserts the whole shape: where the main loops are, which loops are blocks, which are refused.
"""

from __future__ import annotations

from textwrap import dedent

from flortrain.static.analysis import analyse
from flortrain.static.plan import Plan
from flortrain.static.source import parse


def plan_of(src: str) -> Plan:
    # No leading newline: line numbers in the cases are the lines as written.
    return analyse(parse("train.py", dedent(src).lstrip("\n")))


def mains(plan: Plan) -> list[tuple[str, str, int, str]]:
    return [(m.id, m.kind, m.span.line, m.function) for m in plan.main_loops]


def blocks(plan: Plan) -> list[tuple[str, str, int, str, str]]:
    return [(b.id, b.kind, b.span.line, b.function, b.main) for b in plan.blocks]


def refused(plan: Plan) -> list[tuple[int, str, str]]:
    return [(r.span.line, r.function, r.reason) for r in plan.refused]


def test_module_level_for() -> None:
    plan = plan_of("""
        for epoch in range(3):
            for b in loader:
                pass
    """)
    assert mains(plan) == [("M1", "for", 1, "<module>")]
    assert blocks(plan) == [("L2", "for", 2, "<module>", "M1")]
    assert plan.main_loops[0].span.col == 1
    assert plan.blocks[0].span.col == 5
    assert plan.blocks[0].span.end_line == 3


def test_while_main_loop_with_while_block() -> None:
    plan = plan_of("""
        epoch = 0
        while epoch < 3 and not stop:
            i = 0
            while i < 10:
                i += 1
            epoch += 1
    """)
    assert mains(plan) == [("M2", "while", 2, "<module>")]
    assert blocks(plan) == [("L4", "while", 4, "<module>", "M2")]


def test_main_loop_in_main_under_name_guard() -> None:
    plan = plan_of("""
        def main():
            for epoch in range(3):
                for b in loader:
                    pass

        if __name__ == "__main__":
            main()
    """)
    assert mains(plan) == [("M2", "for", 2, "main")]
    assert blocks(plan) == [("L3", "for", 3, "main", "M2")]


def test_main_loop_in_trainer_fit_reaches_method_loop() -> None:
    plan = plan_of("""
        class Trainer:
            def train_epoch(self):
                for b in self.loader:
                    self.opt.step()

            def fit(self, n):
                for epoch in range(n):
                    self.train_epoch()

        Trainer().fit(3)
    """)
    assert mains(plan) == [("M7", "for", 7, "Trainer.fit")]
    assert blocks(plan) == [("L3", "for", 3, "Trainer.train_epoch", "M7")]


def test_method_inherited_from_a_local_base_class() -> None:
    plan = plan_of("""
        class Base:
            def train_epoch(self):
                for b in self.loader:
                    pass

        class Trainer(Base):
            def fit(self, n):
                for epoch in range(n):
                    self.train_epoch()
    """)
    assert mains(plan) == [("M8", "for", 8, "Trainer.fit")]
    assert blocks(plan) == [("L3", "for", 3, "Base.train_epoch", "M8")]


def test_main_loop_inside_try() -> None:
    plan = plan_of("""
        try:
            for epoch in range(3):
                for b in loader:
                    pass
        except KeyboardInterrupt:
            pass
        finally:
            print("done")
    """)
    assert mains(plan) == [("M2", "for", 2, "<module>")]
    assert blocks(plan) == [("L3", "for", 3, "<module>", "M2")]


def test_main_loop_reached_only_through_calls() -> None:
    plan = plan_of("""
        def train_one_epoch(model, loader, opt):
            for b in loader:
                opt.step()

        def evaluate(model, loader):
            correct = 0
            with no_grad():
                for b in loader:
                    correct += 1
            return correct

        for epoch in range(3):
            train_one_epoch(net, dl, optimizer)
            acc = evaluate(net, dl)
    """)
    assert mains(plan) == [("M12", "for", 12, "<module>")]
    assert blocks(plan) == [
        ("L2", "for", 2, "train_one_epoch", "M12"),
        ("L8", "for", 8, "evaluate", "M12"),
    ]


def test_calls_through_a_helper_chain() -> None:
    plan = plan_of("""
        def inner_loop(loader):
            for b in loader:
                pass

        def one_epoch(loader):
            inner_loop(loader)

        for epoch in range(3):
            one_epoch(dl)
    """)
    assert mains(plan) == [("M8", "for", 8, "<module>")]
    assert blocks(plan) == [("L2", "for", 2, "inner_loop", "M8")]


def test_nested_functions() -> None:
    plan = plan_of("""
        def outer():
            def step(b):
                return b

            def run():
                for epoch in range(3):
                    for b in loader:
                        step(b)

            run()

        outer()
    """)
    assert mains(plan) == [("M6", "for", 6, "outer.run")]
    assert blocks(plan) == [("L7", "for", 7, "outer.run", "M6")]


def test_two_sequential_main_loops() -> None:
    plan = plan_of("""
        for epoch in range(3):
            for b in train_loader:
                pass

        for epoch in range(2):
            for b in finetune_loader:
                pass
            while more():
                pass
    """)
    assert mains(plan) == [("M1", "for", 1, "<module>"), ("M5", "for", 5, "<module>")]
    assert blocks(plan) == [
        ("L2", "for", 2, "<module>", "M1"),
        ("L6", "for", 6, "<module>", "M5"),
        ("L8", "while", 8, "<module>", "M5"),
    ]


def test_loop_in_callee_called_from_inside_an_inner_loop_is_part_of_that_block() -> None:
    plan = plan_of("""
        def accumulate(batch):
            s = 0
            for x in batch:
                s += x
            return s

        for epoch in range(3):
            for b in loader:
                total = accumulate(b)
    """)
    assert mains(plan) == [("M7", "for", 7, "<module>")]
    assert blocks(plan) == [("L8", "for", 8, "<module>", "M7")]
    assert "accumulate" in plan.blocks[0].reaches


def test_only_the_outermost_inner_loop_is_a_candidate() -> None:
    plan = plan_of("""
        for epoch in range(3):
            for b in loader:
                for p in params:
                    while p:
                        p = p - 1
    """)
    assert mains(plan) == [("M1", "for", 1, "<module>")]
    assert blocks(plan) == [("L2", "for", 2, "<module>", "M1")]


def test_function_called_from_two_main_loops_belongs_to_the_first() -> None:
    plan = plan_of("""
        def epoch_loop(loader):
            for b in loader:
                pass

        for epoch in range(3):
            epoch_loop(a)

        for epoch in range(3):
            epoch_loop(c)
    """)
    assert mains(plan) == [("M5", "for", 5, "<module>"), ("M8", "for", 8, "<module>")]
    assert blocks(plan) == [("L2", "for", 2, "epoch_loop", "M5")]


def test_main_loop_inside_a_called_function_dominates_the_outer_call_site_loop() -> None:
    """A loop that calls the function holding the epoch loop is itself the outermost loop: the
    whole epoch loop becomes its candidate (Flor memoizes the outermost nesting)."""
    plan = plan_of("""
        def train(seed):
            for epoch in range(3):
                for b in loader:
                    pass

        for seed in range(2):
            train(seed)
    """)
    assert mains(plan) == [("M6", "for", 6, "<module>")]
    assert blocks(plan) == [("L2", "for", 2, "train", "M6")]


def test_one_line_bodies() -> None:
    plan = plan_of("""
        def train(e):
            for b in loader: total = b
        for e in range(3): train(e)
    """)
    assert mains(plan) == [("M3", "for", 3, "<module>")]
    assert blocks(plan) == [("L2", "for", 2, "train", "M3")]


def test_recursion_terminates() -> None:
    plan = plan_of("""
        def walk(node):
            for child in node:
                walk(child)

        def ping(n):
            pong(n)

        def pong(n):
            for i in range(n):
                ping(n - 1)

        walk(tree)
    """)
    # `walk` contains a loop that (recursively) contains itself: it qualifies and is dominated
    # only by itself, so it is a main loop; ping/pong likewise. The point: no infinite recursion.
    assert [m.function for m in plan.main_loops] == ["walk", "pong"]


def test_loops_that_are_not_main_loops() -> None:
    plan = plan_of("""
        for i in range(3):
            print(i)

        xs = [y for x in range(3) for y in range(x)]

        class Table:
            for i in range(3):
                for j in range(3):
                    pass

        async def consume(stream):
            async for epoch in stream:
                for b in epoch:
                    pass

        def never_loops():
            return 1

        for i in range(3):
            never_loops()
    """)
    assert mains(plan) == []
    assert plan.blocks == ()
    assert plan.refused == ()


def test_main_loop_in_an_async_function_refuses_async_inner_loop() -> None:
    plan = plan_of("""
        async def train():
            for epoch in range(3):
                async for b in loader:
                    pass
                for b in loader:
                    pass
    """)
    assert mains(plan) == [("M2", "for", 2, "train")]
    assert blocks(plan) == [("L5", "for", 5, "train", "M2")]
    assert refused(plan) == [(3, "train", "`async for` loops are not memoized")]


def test_candidates_and_refusals_together() -> None:
    plan = plan_of("""
        def train_one_epoch(loader, opt):
            for b in loader:
                opt.step()

        def evaluate(loader):
            for b in loader:
                if b:
                    return b

        for epoch in range(3):
            train_one_epoch(dl, optimizer)
            evaluate(dl)
            for b in loader:
                pass
            else:
                pass
    """)
    assert mains(plan) == [("M10", "for", 10, "<module>")]
    assert blocks(plan) == [("L2", "for", 2, "train_one_epoch", "M10")]
    assert [(line, fn) for line, fn, _ in refused(plan)] == [(13, "<module>"), (6, "evaluate")]
    reasons = {line: reason for line, _, reason in refused(plan)}
    assert "`else:` clause" in reasons[13]
    assert "`return` inside the loop" in reasons[6]
    assert all(r.main == "M10" for r in plan.refused)


def test_explain_lists_main_loops_blocks_and_refusals() -> None:
    plan = plan_of("""
        def main():
            for epoch in range(3):
                for b in loader:
                    opt.step()
                for c in loader:
                    mystery(c)
    """)
    assert plan.explain().splitlines() == [
        "train.py:2:5 main loop M2 (for) in main: it contains the training step (line 4)",
        "  no iteration spans: line 6: rule 5: call to `mystery()` has no side-effect estimate",
        "  train.py:3:9 memoized for loop L3 in main",
        "    changeset: opt [in_place] rule 4 line 4",
        "  train.py:5:9 refused loop in main: line 6: rule 5: call to `mystery()` has no side-effect estimate",
    ]


# -- which loop nest is the main loop ---------------------------------------------------------------
FORWARD_FORWARD = """
    class Layer:
        def train_layer(self, x):
            for i in range(self.num_epochs):
                loss = self.forward(x).pow(2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            return self.forward(x).detach()

    class Net:
        def predict(self, x):
            scores = []
            for label in range(10):
                h = x + label
                for layer in self.layers:
                    h = layer(h)
                scores.append(h)
            return scores

        def train(self, x):
            for layer in self.layers:
                x = layer.train_layer(x)
"""


def test_the_loop_that_trains_is_the_main_loop_not_the_inference_nest() -> None:
    """mnist_forward_forward: training runs through `layer.train_layer(x)` on an element of a
    list, which the pass cannot resolve; the inference nest in `predict` must not be chosen."""
    plan = plan_of(FORWARD_FORWARD)
    (main,) = plan.main_loops
    assert (main.function, main.span.line) == ("Layer.train_layer", 3)
    assert "training step (line 6)" in main.why
    explain = plan.explain()
    assert (
        "train.py:13:9 loop in Net.predict not memoized: not a main loop: it does not train"
        in explain
    )
    assert "train.py:15:13 loop in Net.predict not memoized: inside the loop at line 13" in explain


def test_a_final_evaluation_nest_is_not_a_main_loop() -> None:
    plan = plan_of("""
        for epoch in range(3):
            for x, y in loader:
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
        for split in splits:
            for x, y in split:
                total += metric(model(x), y)
    """)
    assert [m.span.line for m in plan.main_loops] == [1]
    assert [b.span.line for b in plan.blocks] == [2]
    assert "train.py:6:1 loop in <module> not memoized: not a main loop" in plan.explain()


def test_without_a_visible_training_step_every_outermost_nest_is_a_main_loop() -> None:
    plan = plan_of("""
        for epoch in range(3):
            for x in loader:
                trainer.fit_batch(x)
        for split in splits:
            for x in split:
                total += metric(x)
    """)
    assert [m.span.line for m in plan.main_loops] == [1, 4]
    assert all("no backward() or step() found" in m.why for m in plan.main_loops)


def test_explain_says_why_every_other_loop_is_plain_code() -> None:
    plan = plan_of("""
        data = []
        for i in range(100):
            data.append(i)
        def evaluate():
            for x in data:
                for y in x:
                    pass
        for epoch in range(3):
            for b in loader:
                opt.step()
                for p in params:
                    p.grad = None
    """)
    explain = plan.explain()
    assert "train.py:2:1 loop in <module> not memoized: outside every main loop" in explain
    assert (
        "train.py:5:5 loop in evaluate not memoized: not a main loop: it does not train" in explain
    )
    assert "train.py:6:9 loop in evaluate not memoized: inside the loop at line 5" in explain
    assert "train.py:11:9 loop in <module> not memoized: part of memoized loop L9" in explain


def test_a_carried_iterator_is_named_as_the_reason_for_no_iteration_spans() -> None:
    """``batch = next(loader_iter)`` with a fresh iterator when it runs out (the recycling idiom,
    makemore's ``InfiniteDataLoader.next``): the main loop has no boundary state because it
    carries an iterator's position across iterations, and the reason says so with the line that
    advances it, not as a rebinding after an in-place change."""
    plan = plan_of("""
        loader_iter = iter(loader)
        for step in range(100):
            try:
                x = next(loader_iter)
            except StopIteration:
                loader_iter = iter(loader)
                x = next(loader_iter)
            opt.step()
    """)
    assert plan.explain().splitlines()[1] == (
        "  no iteration spans: line 4: the loop advances `loader_iter`, an iterator made before"
        " it, whose position no checkpoint holds (line 6 replaces it)"
    )
    plan = plan_of("""
        class Infinite:
            def __init__(self, loader):
                self.loader = loader
                self.data_iter = iter(loader)

            def next(self):
                try:
                    batch = self.data_iter.__next__()
                except StopIteration:
                    self.data_iter = iter(self.loader)
                    batch = next(self.data_iter)
                return batch

        batches = Infinite(loader)
        while True:
            x = batches.next()
            opt.step()
    """)
    assert plan.explain().splitlines()[1] == (
        "  no iteration spans: line 16: in `Infinite.next()`: line 8: the loop advances"
        " `self.data_iter`, an iterator made before it, whose position no checkpoint holds"
        " (line 10 replaces it)"
    )
