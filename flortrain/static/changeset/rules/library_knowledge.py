"""Library knowledge: calls into known libraries change what their documentation says."""

from __future__ import annotations

import libcst as cst

from flortrain.static import library
from flortrain.static.changeset.host import Walk
from flortrain.static.changeset.rule import Case, ChangesetRule, P, R, Refused
from flortrain.static.expressions import object_expr, root
from flortrain.static.plan import Restore


class LibraryKnowledge(ChangesetRule):
    name = "library-knowledge"
    pattern = (
        "a call into an imported library (`random.shuffle(x)`, `torch.add(.., out=c)`), or a"
        " call nested in an expression"
    )
    change = "the arguments it is known to mutate, in place; nothing for seeding and reads"
    doc = (
        "Known library behaviour (`flortrain.static.library`) refines rules 1, 4 and 5: a"
        " function that mutates an argument (`heapq.heappush`, `np.add.at`, `torch.*_`) charges"
        " that argument, a `generator=`/`out=` keyword charges what it names, seeding and reads"
        " change nothing, and mutating an imported module is refused. A call nested in an"
        " expression is judged like an assigned one (rules 1/2): `if rng.random() < p:` advances"
        " `rng`."
    )
    cases = (
        # calls nested inside expressions advance their receivers just like bare ones (a replay with
        # `rng` left behind draws different augmentation from the first skipped instance on)
        Case(
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
        Case(
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
        Case(
            "nested-generator-keyword",
            """
            import torch
            for epoch in range(3):
                for j in batches:
                    b = 1 + torch.randn(3, generator=g)
        """,
            {("g", P)},
        ),
        Case(
            "nested-pure-methods-charge-nothing",
            """
            for epoch in range(3):
                for x, y in loader:
                    correct += (model(x).argmax(1) == y).float().sum().item()
                print(correct)
        """,
            {("correct", R)},
        ),
        Case(
            "assigned-next-advances-the-iterator",
            """
            for epoch in range(3):
                for step in range(10):
                    batch = next(it)
        """,
            {("it", P)},
        ),
        Case(
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
        Case(
            "random-shuffle",
            """
            import random
            for epoch in range(3):
                for b in loader:
                    random.shuffle(idx)
        """,
            {("idx", P)},
        ),
        Case(
            "from-random-import-shuffle",
            """
            from random import shuffle
            for epoch in range(3):
                for b in loader:
                    shuffle(idx)
        """,
            {("idx", P)},
        ),
        Case(
            "numpy-random-shuffle",
            """
            import numpy as np
            for epoch in range(3):
                for b in loader:
                    np.random.shuffle(a)
        """,
            {("a", P)},
        ),
        Case(
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
        Case(
            "torch-underscore-function",
            """
            import torch
            for epoch in range(3):
                for b in loader:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        """,
            {("model", P)},
        ),
        Case(
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
        Case(
            "out-keyword",
            """
            import torch
            for epoch in range(3):
                for b in loader:
                    torch.add(a, b, out=acc)
        """,
            {("acc", P)},
        ),
        Case(
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
        Case(
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
    )


def keyword_mutation(w: Walk, a: cst.Arg, line: int) -> None:
    """``torch.randn(.., generator=g)`` advances g; ``torch.add(a, b, out=c)`` writes c. A
    library's own object (``torch.default_generator``) is global RNG state, which every
    checkpoint captures anyway."""
    if (
        a.keyword is not None
        and a.keyword.value in library.MUTATED_KEYWORDS
        and isinstance(a.value, cst.Name | cst.Attribute | cst.Subscript)
    ):
        obj = object_expr(a.value, w.module)
        if obj is not None and root(obj) not in w.prog.imported:
            w.add(obj, Restore.IN_PLACE, 4, line)


def library_call(w: Walk, name: str, call: cst.Call, line: int) -> None:
    if name.rsplit(".", 1)[-1] in library.RNG_SEEDERS:
        return
    idx = library.mutating_library_arg(name)
    if idx is not None:
        mutated_arg(w, call, idx, line)


def mutated_arg(w: Walk, call: cst.Call, idx: int, line: int) -> None:
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if idx < len(positional):
        obj = object_expr(positional[idx].value, w.module)
        if obj is not None:
            w.add_target_object(obj, line, 4)
