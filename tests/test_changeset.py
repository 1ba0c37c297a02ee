"""The changeset of a memoized loop: Flor's Table 2 rules with their precedence, the loop-scoped
filter, library knowledge, alias propagation and interprocedural mapping.

Each case is a small script with one main loop and one candidate inner loop, and either the exact
expected changeset as ``{(expr, Restore)}`` or the expected refusal (a substring of its reason).
A wrong changeset is a wrong replay, so every case pins the whole set, not a member of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from textwrap import dedent

import pytest

from flortrain.static.analysis import analyse
from flortrain.static.plan import Block, Plan, Restore
from flortrain.static.source import parse

P = Restore.IN_PLACE
R = Restore.REBOUND


@dataclass(frozen=True)
class Refused:
    """The single candidate loop must be refused with a reason containing ``reason``."""

    reason: str


def plan_of(src: str) -> Plan:
    return analyse(parse("train.py", dedent(src)))


def only_block(plan: Plan) -> Block:
    assert len(plan.main_loops) == 1, plan.explain()
    assert not plan.refused, plan.explain()
    assert len(plan.blocks) == 1, plan.explain()
    return plan.blocks[0]


def changeset(src: str) -> set[tuple[str, Restore]]:
    return {(c.expr, c.restore) for c in only_block(plan_of(src)).changeset}


def check(src: str, expected: set[tuple[str, Restore]] | Refused) -> None:
    plan = plan_of(src)
    if isinstance(expected, Refused):
        assert len(plan.main_loops) == 1, plan.explain()
        assert not plan.blocks, plan.explain()
        assert len(plan.refused) == 1, plan.explain()
        assert expected.reason in plan.refused[0].reason, plan.explain()
    else:
        block = only_block(plan)
        assert {(c.expr, c.restore) for c in block.changeset} == expected, plan.explain()
        assert len(block.changeset) == len(expected), "duplicate changeset entries"


def case(id: str, src: str, expected: set[tuple[str, Restore]] | Refused) -> object:
    return pytest.param(src, expected, id=id)


# -- Table 2, rule by rule, and precedence --------------------------------------------------------

TABLE2 = [
    # rule 0: a name mutated in place, then rebound: which object to restore into is ambiguous
    case(
        "rule0-mutate-then-rebind",
        """
        for epoch in range(3):
            for b in loader:
                model.step()
                model = other
    """,
        Refused("rule 0"),
    ),
    case(
        "rule0-beats-rule1",
        """
        for epoch in range(3):
            for b in loader:
                opt.step()
                opt = factory.make_optimizer()
    """,
        Refused("rule 0: `opt` is rebound"),
    ),
    case(
        "rule0-attribute-target",
        """
        for epoch in range(3):
            for b in loader:
                self.opt.step()
                self.opt = make()
    """,
        Refused("rule 0: `self.opt`"),
    ),
    case(
        "rule0-name-whose-attribute-was-mutated",
        """
        for epoch in range(3):
            for b in loader:
                model.fc.reset()
                model = other
    """,
        Refused("mutated `model.fc` in place"),
    ),
    case(
        "rule0-not-for-accumulator-rebound-twice",
        """
        total = 0
        for epoch in range(3):
            for b in loader:
                total += b
                total += 1
        print(total)
    """,
        {("total", R)},
    ),
    case(
        "rule0-not-for-object-created-in-loop",
        """
        buf = None
        for epoch in range(3):
            for b in loader:
                buf = []
                buf.append(b)
                buf = buf[-2:]
        print(buf)
    """,
        {("buf", R)},
    ),
    case(
        "rebound-then-mutated-restores-by-rebinding",
        """
        for epoch in range(3):
            for b in loader:
                model = fresh_model()
                model.step()
        print(model)
    """,
        {("model", R)},
    ),
    # rule 1: v = obj.method(...) -> {obj, v}
    case(
        "rule1",
        """
        for epoch in range(3):
            for b in loader:
                out = model.forward(b)
        print(out)
    """,
        {("model", P), ("out", R)},
    ),
    case(
        "rule1-tuple-targets",
        """
        for epoch in range(3):
            for b in loader:
                first, second = queue.pop_two()
        print(first, second)
    """,
        {("queue", P), ("first", R), ("second", R)},
    ),
    # rule 2: v = func(...) -> {v}; an unknown function is fine when assigned
    case(
        "rule2",
        """
        for epoch in range(3):
            for b in loader:
                y = compute(b)
        print(y)
    """,
        {("y", R)},
    ),
    # rule 3: v = u -> {v}
    case(
        "rule3",
        """
        for epoch in range(3):
            for b in loader:
                last = b
        print(last)
    """,
        {("last", R)},
    ),
    case(
        "rule3-swap",
        """
        a, c = 0, 1
        for epoch in range(3):
            for b in loader:
                a, c = c, a
        print(a, c)
    """,
        {("a", R), ("c", R)},
    ),
    # rule 4: obj.method(...) -> {obj}
    case(
        "rule4",
        """
        for epoch in range(3):
            for b in loader:
                opt.zero_grad()
                opt.step()
    """,
        {("opt", P)},
    ),
    case(
        "rule4-on-subscript-and-chained-call",
        """
        for epoch in range(3):
            for b in loader:
                buckets[b].append(b)
                stats.setdefault(b, []).append(b)
    """,
        {("buckets", P), ("stats", P)},
    ),
    # rule 5: func(...) -> no estimate
    case(
        "rule5-unknown-function",
        """
        for epoch in range(3):
            for b in loader:
                mystery(b)
    """,
        Refused("rule 5: call to `mystery()`"),
    ),
    case(
        "rule5-lambda-call",
        """
        for epoch in range(3):
            for b in loader:
                (lambda v: v)(b)
    """,
        Refused("rule 5"),
    ),
    case(
        "rule5-not-for-pure-builtins",
        """
        for epoch in range(3):
            for b in loader:
                print(b)
                len(b)
                isinstance(b, int)
    """,
        set(),
    ),
    case(
        "rule5-for-a-builtin-name-the-script-rebinds",
        """
        print = make_printer()
        for epoch in range(3):
            for b in loader:
                print(b)
    """,
        Refused("rule 5: call to `print()`"),
    ),
    case(
        "mutating-builtin-next",
        """
        it = iter(data)
        for epoch in range(3):
            for b in loader:
                next(it)
    """,
        {("it", P)},
    ),
]


@pytest.mark.parametrize(("src", "expected"), TABLE2)
def test_table2_rules(src: str, expected: set[tuple[str, Restore]] | Refused) -> None:
    check(src, expected)


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


# -- the loop-scoped filter, restoration kinds, targets --------------------------------------------

FILTER_AND_TARGETS = [
    case(
        "loop-scoped-dropped-used-after-kept",
        """
        for epoch in range(3):
            for b in loader:
                loss = model(b)
                last = model(b)
            print(last)
    """,
        {("last", R)},
    ),
    case(
        "rebound-before-the-next-instance-reads-it-is-dropped",
        """
        for epoch in range(3):
            seen = 0
            for b in loader:
                seen = seen + 1
    """,
        set(),
    ),
    case(
        "read-by-the-next-instance-is-kept",
        """
        seen = 0
        for epoch in range(3):
            for b in loader:
                seen = seen + 1
    """,
        {("seen", R)},
    ),
    case(
        "use-in-a-function-counts-as-outside",
        """
        def report():
            print(best)

        for epoch in range(3):
            for b in loader:
                best = b
            report()
    """,
        {("best", R)},
    ),
    case(
        "loop-variable-used-after",
        """
        for epoch in range(3):
            for step, b in enumerate(loader):
                pass
            print(step)
    """,
        {("step", R)},
    ),
    case(
        "in-place-vs-rebound",
        """
        total = 0
        for epoch in range(3):
            for b in loader:
                history.append(b)
                total += b
        print(total)
    """,
        {("history", P), ("total", R)},
    ),
    case(
        "augmented-assignment-with-a-pure-call",
        """
        running = 0.0
        for epoch in range(3):
            for b in loader:
                loss = model(b)
                running += loss.item()
        print(running)
    """,
        {("running", R)},
    ),
    case(
        "augmented-subscript-is-in-place",
        """
        for epoch in range(3):
            for b in loader:
                counts[b] += 1
    """,
        {("counts", P)},
    ),
    case(
        "subscript-target-is-in-place",
        """
        for epoch in range(3):
            for k, v in loader:
                hist[k] = v
    """,
        {("hist", P)},
    ),
    case(
        "attribute-target-is-rebound",
        """
        class T:
            def epoch(self):
                for b in self.loader:
                    self.step += 1

        t = T()
        for epoch in range(3):
            t.epoch()
    """,
        {("self.step", R)},
    ),
    case(
        "data-attribute-is-a-view-of-its-owner",
        """
        for epoch in range(3):
            for b in loader:
                model.fc.weight.data = b
    """,
        {("model.fc.weight", P)},
    ),
    case(
        "known-pure-method-does-not-charge-receiver",
        """
        x = start
        for epoch in range(3):
            for b in loader:
                x = x.detach()
                n = x.item()
        print(x, n)
    """,
        {("x", R), ("n", R)},
    ),
    case(
        "with-as-import-names-used-after",
        """
        for epoch in range(3):
            for b in loader:
                with open(b) as fh:
                    pass
                import json as codec
            print(fh, codec)
    """,
        {("fh", R)},
    ),  # an imported module is the same object on replay: nothing to restore
    case(
        "match-captures-used-after",
        """
        for epoch in range(3):
            for b in loader:
                match b:
                    case {"x": Point(x=px)}:
                        pass
                    case [head, *tail]:
                        pass
            print(px, head, tail, Point)
    """,
        {("px", R), ("head", R), ("tail", R)},
    ),
    case(
        "except-as-name-is-not-restored",
        """
        for epoch in range(3):
            for b in loader:
                try:
                    pass
                except ValueError as err:
                    pass
            print(err)
    """,
        set(),
    ),
    case(
        "walrus-binding",
        """
        for epoch in range(3):
            for b in loader:
                if (n := len(b)) > 2:
                    pass
            print(n)
    """,
        {("n", R)},
    ),
]


@pytest.mark.parametrize(("src", "expected"), FILTER_AND_TARGETS)
def test_filter_and_targets(src: str, expected: set[tuple[str, Restore]] | Refused) -> None:
    check(src, expected)


# -- library knowledge -------------------------------------------------------------------------

LIBRARY = [
    # calls nested inside expressions advance their receivers just like bare ones (a replay with
    # `rng` left behind draws different augmentation from the first skipped instance on)
    case(
        "nested-method-call-in-expression",
        """
        import numpy as np
        rng = np.random.default_rng(0)
        for epoch in range(3):
            for j in batches:
                x = X[j] + 0.1 * rng.standard_normal((32, 16))
    """,
        {("rng", P)},
    ),
    case(
        "nested-call-in-if-test",
        """
        for epoch in range(3):
            for j in batches:
                if pyrng.random() < 0.5:
                    flips += 1
            print(flips)
    """,
        {("pyrng", P), ("flips", R)},
    ),
    case(
        "nested-generator-keyword",
        """
        import torch
        for epoch in range(3):
            for j in batches:
                b = 1 + torch.randn(3, generator=g)
    """,
        {("g", P)},
    ),
    case(
        "nested-pure-methods-charge-nothing",
        """
        for epoch in range(3):
            for x, y in loader:
                correct += (model(x).argmax(1) == y).float().sum().item()
            print(correct)
    """,
        {("correct", R)},
    ),
    case(
        "assigned-next-advances-the-iterator",
        """
        for epoch in range(3):
            for step in range(10):
                batch = next(it)
    """,
        {("it", P)},
    ),
    case(
        "heapq-and-numpy-at-mutate-their-first-argument",
        """
        import heapq
        import numpy as np
        for epoch in range(3):
            for x, y in loader:
                heapq.heappush(worst, (-1.0, epoch))
                np.add.at(confusion, (y, y), 1)
    """,
        {("worst", P), ("confusion", P)},
    ),
    case(
        "random-shuffle",
        """
        import random
        for epoch in range(3):
            for b in loader:
                random.shuffle(idx)
    """,
        {("idx", P)},
    ),
    case(
        "from-random-import-shuffle",
        """
        from random import shuffle
        for epoch in range(3):
            for b in loader:
                shuffle(idx)
    """,
        {("idx", P)},
    ),
    case(
        "numpy-random-shuffle",
        """
        import numpy as np
        for epoch in range(3):
            for b in loader:
                np.random.shuffle(a)
    """,
        {("a", P)},
    ),
    case(
        "local-generator-shuffle-charges-its-argument",
        """
        import numpy as np
        rng = np.random.default_rng(0)
        for epoch in range(3):
            for b in loader:
                rng.shuffle(idx)
    """,
        {("rng", P), ("idx", P)},
    ),
    case(
        "torch-underscore-function",
        """
        import torch
        for epoch in range(3):
            for b in loader:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """,
        {("model", P)},
    ),
    case(
        "private-generator-keyword",
        """
        import torch
        g = torch.Generator()
        for epoch in range(3):
            for b in loader:
                noise = torch.randn(3, generator=g)
                perm = torch.randperm(8, generator=g)
    """,
        {("g", P)},
    ),
    case(
        "out-keyword",
        """
        import torch
        for epoch in range(3):
            for b in loader:
                torch.add(a, b, out=acc)
    """,
        {("acc", P)},
    ),
    case(
        "seeding-and-library-reads-change-nothing",
        """
        import torch
        import numpy as np
        for epoch in range(3):
            for b in loader:
                torch.manual_seed(0)
                np.random.seed(0)
                x = torch.zeros(3)
    """,
        set(),
    ),
    case(
        "assigning-into-a-module-refuses",
        """
        import torch
        for epoch in range(3):
            for b in loader:
                torch.backends.flag = b
                torch.cache[b] = b
    """,
        Refused("mutates module `torch`"),
    ),
]


@pytest.mark.parametrize(("src", "expected"), LIBRARY)
def test_library_knowledge(src: str, expected: set[tuple[str, Restore]] | Refused) -> None:
    check(src, expected)


# -- alias propagation -------------------------------------------------------------------------

ALIASES = [
    case(
        "loop-over-a-tuple-literal-mutates-each-object",
        """
        for epoch in range(3):
            for m in (loss_meter, acc_meter):
                m.reset()
            print(epoch)
    """,
        {("loss_meter", P), ("acc_meter", P)},
    ),
    case(
        "loop-over-a-list-literal-setting-attributes",
        """
        for epoch in range(3):
            for layer in [model.enc, model.head, 3]:
                layer.frozen = epoch < 1
            print(epoch)
    """,
        {("model.enc", P), ("model.head", P)},
    ),
    case(
        "loop-variable-rebound-in-the-body-takes-nothing-more",
        """
        for epoch in range(3):
            for m in (a, b):
                m = fresh()
                m.reset()
            print(epoch)
    """,
        set(),
    ),
    case(
        "parameters-loop-charges-model",
        """
        for epoch in range(3):
            for b in loader:
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.1)
                    p.grad.zero_()
    """,
        {("model", P)},
    ),
    case(
        "named-parameters-loop",
        """
        for epoch in range(3):
            for b in loader:
                for name, p in model.named_parameters():
                    p.grad = None
    """,
        {("model", P)},
    ),
    case(
        "param-groups-item-assignment",
        """
        for epoch in range(3):
            for b in loader:
                for g in opt.param_groups:
                    g["lr"] = 0.1
    """,
        {("opt.param_groups", P)},
    ),
    case(
        "view-by-assignment",
        """
        for epoch in range(3):
            for b in loader:
                w = model.weight
                w.mul_(0.5)
    """,
        {("model.weight", P)},
    ),
    case(
        "zip-destructured-element-by-element",
        """
        for epoch in range(3):
            for b in loader:
                for p, e in zip(model.parameters(), ema.parameters()):
                    e.data.mul_(0.9).add_(p.data)
    """,
        {("ema", P)},
    ),
    case(
        "enumerate-zip-nested",
        """
        for epoch in range(3):
            for b in loader:
                for i, (src, dst) in enumerate(zip(a.parameters(), c.parameters())):
                    dst.zero_()
    """,
        {("c", P)},
    ),
    case(
        "rebinding-a-view-charges-nothing-else",
        """
        for epoch in range(3):
            for b in loader:
                for p in model.parameters():
                    p = p * 2
    """,
        set(),
    ),
    case(
        "rebinding-a-view-after-mutating-through-it-is-not-rule-0",
        """
        for epoch in range(3):
            for b in loader:
                for p in model.parameters():
                    p.data.mul_(0.5)
                    p = p.grad
    """,
        {("model", P)},
    ),
]


@pytest.mark.parametrize(("src", "expected"), ALIASES)
def test_alias_propagation(src: str, expected: set[tuple[str, Restore]] | Refused) -> None:
    check(src, expected)


# -- interprocedural mapping, methods, globals, closures -------------------------------------------

INTERPROCEDURAL = [
    case(
        "caller-loop-calls-local-step",
        """
        def step(model, opt, batch):
            loss = model(batch)
            loss.backward()
            opt.step()
            return loss

        for epoch in range(3):
            for b in loader:
                step(net, optimizer, b)
    """,
        {("optimizer", P)},
    ),
    case(
        "keyword-arguments-map-too",
        """
        def step(model, opt, batch):
            opt.step()

        for epoch in range(3):
            for b in loader:
                step(net, batch=b, opt=optimizer)
    """,
        {("optimizer", P)},
    ),
    case(
        "callee-attribute-of-parameter",
        """
        def bump(state):
            state.count += 1

        for epoch in range(3):
            for b in loader:
                bump(trainer)
    """,
        {("trainer.count", R)},
    ),
    case(
        "callee-rebinding-its-parameter-is-invisible",
        """
        def f(x):
            x = x + 1
            return x

        for epoch in range(3):
            for b in loader:
                f(total)
    """,
        set(),
    ),
    case(
        "star-args-cannot-be-mapped",
        """
        def step(model, opt):
            opt.step()

        for epoch in range(3):
            for b in loader:
                step(*pair)
    """,
        Refused("cannot map `step()`'s arguments"),
    ),
    case(
        "refusal-inside-callee-names-it",
        """
        def step(batch):
            mystery(batch)

        for epoch in range(3):
            for b in loader:
                step(b)
    """,
        Refused("in `step()`: line 3: rule 5"),
    ),
    case(
        "global-mutated-in-place-by-callee",
        """
        hist = []

        def log(v):
            hist.append(v)

        for epoch in range(3):
            for b in loader:
                log(b)
    """,
        {("hist", P)},
    ),
    case(
        "global-rebound-by-callee",
        """
        counter = 0

        def bump():
            global counter
            counter += 1

        for epoch in range(3):
            for b in loader:
                bump()
        print(counter)
    """,
        {("counter", R)},
    ),
    case(
        "global-hidden-by-a-local-refuses",
        """
        hist = []

        def log(v):
            hist.append(v)

        def main():
            hist = {}
            for epoch in range(3):
                for b in loader:
                    log(b)
            print(hist)
    """,
        Refused("a local `hist` hides"),
    ),
    case(
        "closure-mutated-in-place-by-nested-function",
        """
        def main():
            hist = []

            def log(v):
                hist.append(v)

            for epoch in range(3):
                for b in loader:
                    log(b)
            print(hist)
    """,
        {("hist", P)},
    ),
    case(
        "nonlocal-rebound-by-nested-function",
        """
        def main():
            total = 0

            def bump():
                nonlocal total
                total += 1

            for epoch in range(3):
                for b in loader:
                    bump()
            print(total)
    """,
        {("total", R)},
    ),
    case(
        "nonlocal-rebound-from-a-sibling-refuses",
        """
        def main():
            total = 0

            def bump():
                nonlocal total
                total += 1

            def train():
                for epoch in range(3):
                    for b in loader:
                        bump()

            train()
    """,
        Refused("rebinds `total` of `main()`"),
    ),
    case(
        "method-receiver-maps-self",
        """
        class Trainer:
            def __init__(self):
                self.optimizer = make()

            def train_step(self, b):
                self.optimizer.step()

        trainer = Trainer()
        for epoch in range(3):
            for b in loader:
                trainer.train_step(b)
    """,
        {("trainer.optimizer", P)},
    ),
]


@pytest.mark.parametrize(("src", "expected"), INTERPROCEDURAL)
def test_interprocedural(src: str, expected: set[tuple[str, Restore]] | Refused) -> None:
    check(src, expected)


# Hooks run inside a loop without being called by it: `model(x)` runs forward hooks,
# `loss.backward()` runs backward hooks. What they change joins every loop that makes a call.
HOOKS = [
    case(
        "factory-hook-fills-a-global-dict",
        """
        acts = {}

        def save(name):
            def hook(mod, inp, out):
                acts[name] = out.mean().item()
            return hook

        model.fc.register_forward_hook(save("fc"))
        for epoch in range(3):
            for b in loader:
                loss = model(b)
            print(acts)
    """,
        {("acts", P)},
    ),
    case(
        "function-hook-rebinds-a-global",
        """
        peak = 0.0

        def track(mod, grad_in, grad_out):
            global peak
            peak = max(peak, grad_out[0].abs().max().item())

        model.register_full_backward_hook(track)
        for epoch in range(3):
            for b in loader:
                model(b).sum().backward()
            print(peak)
    """,
        {("peak", R)},
    ),
    case(
        "lambda-hook-keyword-argument",
        """
        def main():
            norms = []
            w.register_hook(hook=lambda g: norms.append(g.norm()))
            for epoch in range(3):
                for b in loader:
                    (w * b).sum().backward()
            print(norms)
    """,
        {("norms", P)},
    ),
    case(
        "method-hook-on-a-local-class",
        """
        class Stats:
            def __init__(self):
                self.seen = 0

            def on_forward(self, mod, inp, out):
                total.append(out)

        total = []
        stats = Stats()
        model.register_forward_hook(stats.on_forward)
        for epoch in range(3):
            for b in loader:
                out = model(b)
    """,
        {("total", P)},
    ),
    case(
        "hook-changing-only-its-parameters-and-locals-adds-nothing",
        """
        def scale(mod, inp, out):
            tmp = out * 2
            mod.calls = 1
            return tmp

        model.register_forward_hook(scale)
        for epoch in range(3):
            for b in loader:
                out = model(b)
    """,
        set(),
    ),
    case(
        "loop-without-calls-cannot-trigger-hooks",
        """
        acts = []
        model.register_forward_hook(lambda m, i, o: acts.append(o))
        xs = [1, 2, 3]
        for epoch in xs:
            for b in xs:
                total = b
            print(total)
    """,
        {("total", R)},
    ),
    case(
        "hook-changing-a-factory-variable-refuses",
        """
        def counter():
            seen = []
            def hook(mod, inp, out):
                seen.append(out)
            return hook

        model.register_forward_hook(counter())
        for epoch in range(3):
            for b in loader:
                out = model(b)
    """,
        Refused("changes `seen`, which is not visible here"),
    ),
    case(
        "hook-changing-main-locals-refuses-a-loop-in-another-function",
        """
        def train(loader):
            for b in loader:
                out = model(b)

        def main():
            acts = []
            model.register_forward_hook(lambda m, i, o: acts.append(o))
            for epoch in range(3):
                train(loader)
            print(acts)
    """,
        Refused("changes `acts`, which is not visible here"),
    ),
]


# Functions handed to a call may be called by it: their effects count where they are passed.
CALLBACKS = [
    case(
        "lbfgs-closure-defined-in-the-loop",
        """
        evals = 0
        for epoch in range(3):
            for b in loader:
                def closure():
                    global evals
                    evals += 1
                    opt.zero_grad()
                    return loss_fn(model(b))
                loss = opt.step(closure)
            print(evals, loss)
    """,
        {("evals", R), ("opt", P), ("loss", R), ("b", R)},
    ),  # `b`: the closure reads it
    case(
        "module-level-closure-passed-by-name",
        """
        seen = []

        def closure():
            seen.append(1)
            return 0.0

        for epoch in range(3):
            for b in loader:
                opt.step(closure)
    """,
        {("seen", P), ("opt", P)},
    ),
    case(
        "lambda-callback-changes-a-global",
        """
        log = []
        for epoch in range(3):
            for b in loader:
                model.apply(lambda m: log.append(type(m)))
    """,
        {("log", P), ("model", P)},
    ),
    case(
        "lambda-callback-changing-only-its-argument",
        """
        for epoch in range(3):
            for b in loader:
                model.apply(lambda m: m.reset_parameters())
    """,
        {("model", P)},
    ),
    case(
        "pure-key-function-adds-nothing",
        """
        def by_loss(r):
            return r[1]

        for epoch in range(3):
            for b in loader:
                best = sorted(results, key=by_loss)
            print(best)
    """,
        {("best", R)},
    ),
    case(
        "function-defined-in-the-loop-and-used-after-refuses",
        """
        for epoch in range(3):
            for b in loader:
                loss = step(b)
                def report(v, l=loss):
                    return (v, l)
            print(report("end"))
    """,
        Refused("function `report` is defined inside the loop and used after it"),
    ),
    case(
        "class-defined-in-the-loop-and-used-after-refuses",
        """
        for epoch in range(3):
            for b in loader:
                class Marker:
                    pass
            print(Marker)
    """,
        Refused("class `Marker` is defined inside the loop"),
    ),
    case(
        "function-defined-in-the-loop-used-only-inside-is-dropped",
        """
        for epoch in range(3):
            for b in loader:
                def scaled(v):
                    return v * 2
                total = scaled(b)
            print(total)
    """,
        {("total", R)},
    ),
]


@pytest.mark.parametrize(("src", "expected"), CALLBACKS)
def test_callbacks_and_functions_defined_in_loops(
    src: str, expected: set[tuple[str, Restore]] | Refused
) -> None:
    check(src, expected)


@pytest.mark.parametrize(("src", "expected"), HOOKS)
def test_hooks(src: str, expected: set[tuple[str, Restore]] | Refused) -> None:
    check(src, expected)


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

ESCAPES = [
    case(
        "return-inside-loop",
        """
        def train():
            for epoch in range(3):
                for b in loader:
                    if b:
                        return b
    """,
        Refused("`return` inside the loop"),
    ),
    case(
        "yield-inside-loop",
        """
        def batches():
            for epoch in range(3):
                for b in loader:
                    yield b
    """,
        Refused("`yield` inside the loop"),
    ),
    case(
        "for-else",
        """
        for epoch in range(3):
            for b in loader:
                pass
            else:
                pass
    """,
        Refused("`else:` clause"),
    ),
    case(
        "while-else",
        """
        for epoch in range(3):
            while cond():
                pass
            else:
                pass
    """,
        Refused("`else:` clause"),
    ),
    case(
        "async-for-inner-loop",
        """
        async def train():
            for epoch in range(3):
                async for b in loader:
                    pass
    """,
        Refused("`async for`"),
    ),
    case(
        "await-inside-loop",
        """
        async def train():
            for epoch in range(3):
                for b in loader:
                    x = await fetch(b)
    """,
        Refused("`await` inside the loop"),
    ),
    case(
        "del-of-a-name-the-loop-does-not-own",
        """
        for epoch in range(3):
            for b in loader:
                del model
    """,
        Refused("`del model`"),
    ),
]


@pytest.mark.parametrize(("src", "expected"), ESCAPES)
def test_escapes_refuse(src: str, expected: Refused) -> None:
    check(src, expected)


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
