"""Clock readings are restored but not compared, and a project module that does not train has no
main loop.

The shape is pytorch/examples' word_language_model: a module tokenizes a text file word by word,
and the batch loop takes ``start_time = time.time()`` anew at every log line, with ``elapsed``
and ``ms_per_batch`` made from it. Comparing those with the record's checkpoint called every
faithful replay that executes the batch loop unfaithful; taking the tokenizer's loops for main
loops checkpointed thousands of instances of plain setup code. Like word_language_model, the
script updates its parameters by hand (a torch.optim optimizer would import torch._dynamo, about
a CPU-second a process).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from flortrain.static.analysis import analyse, module_prefix
from flortrain.static.source import parse
from tests.protocol import flortrain, replay_matches_plain, store_count

TOKENIZER = """\
# a tiny corpus: words to ids, read from a text file

import torch


class Vocab:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.words: list[str] = []

    def add(self, word: str) -> int:
        if word not in self.index:
            self.index[word] = len(self.words)
            self.words.append(word)
        return self.index[word]

    def __len__(self) -> int:
        return len(self.words)


class Corpus:
    def __init__(self, path: str) -> None:
        self.vocab = Vocab()
        self.ids = self.read(path)

    def read(self, path: str) -> torch.Tensor:
        with open(path, encoding="utf8") as f:
            for line in f:
                tokens = line.split() + ["<eos>"]
                for tok in tokens:
                    self.vocab.add(tok)
        rows = []
        with open(path, encoding="utf8") as f:
            for line in f:
                row = []
                for tok in line.split() + ["<eos>"]:
                    row.append(self.vocab.index[tok])
                rows.append(torch.tensor(row, dtype=torch.int64))
        return torch.cat(rows)
"""

TRAIN = """\
import time

import torch
import torch.nn.functional as F

import tok

corpus = tok.Corpus("corpus.txt")
ntokens = len(corpus.vocab)
torch.manual_seed(0)
emb = torch.nn.Embedding(ntokens, 8)
head = torch.nn.Linear(8, ntokens)
params = [*emb.parameters(), *head.parameters()]
data = corpus.ids
bptt, log_interval = 4, 2

start_time = time.time()
for epoch in range(3):
    total_loss = 0.0
    for batch, i in enumerate(range(0, data.size(0) - 1, bptt)):
        n = min(bptt, data.size(0) - 1 - i)
        x, y = data[i : i + n], data[i + 1 : i + 1 + n]
        loss = F.cross_entropy(head(emb(x)), y)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= 0.5 * p.grad
                p.grad = None
        total_loss += loss.item()
        if batch % log_interval == 0 and batch > 0:
            elapsed = time.time() - start_time
            ms_per_batch = elapsed * 1000 / log_interval
            print(f"| epoch {epoch} | batch {batch} | loss {total_loss / log_interval:.4f}")
            total_loss = 0.0
            start_time = time.time()
        #PROBE
    print(f"end of epoch {epoch}")
print("timed", ms_per_batch >= 0)
"""

CORPUS = "the cat sat on the mat\nthe dog sat on the log\na cat and a dog\n"


def test_clock_readings_are_left_out_of_the_comparison() -> None:
    plan = analyse(parse("train.py", TRAIN))
    (block,) = plan.blocks
    assert set(block.unchecked) == {"start_time", "ms_per_batch"}, plan.explain()
    assert {"start_time", "ms_per_batch"} <= {c.expr for c in block.changeset}
    assert "start_time [rebound, a clock reading: restored, not compared]" in plan.explain()


LOOP = """\
import torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [torch.randn(3, 2) for _ in range(2)]
lr = 0.1
{setup}
for epoch in range(2):
    for x in data:
        model(x).sum().backward()
        opt.step()
        {body}
print(t0, dt)
"""

CLOCKS = {
    "datetime": (
        "from datetime import datetime; t0 = datetime.now()",
        "dt = (datetime.now() - t0).total_seconds(); t0 = datetime.now()",
    ),
    "perf_counter": (
        "import time; t0 = time.perf_counter()",
        "dt = round(time.perf_counter() - t0, 3); t0 = time.perf_counter()",
    ),
    "bare import": (
        "from time import monotonic; t0 = monotonic()",
        "dt = monotonic() - t0; t0 = monotonic()",
    ),
    "timeit": (
        "import timeit; t0 = timeit.default_timer()",
        "dt = -(t0 - timeit.default_timer()) * 1000 / 4; t0 = dt",
    ),
    "accumulated": ("import time; t0 = 0.0; dt = 0", "dt += time.time() - t0; t0 = time.time()"),
}

NOT_CLOCKS = {
    "a value that trains": ("import time; t0 = time.time()", "dt = lr * 0.5; t0 = time.time()"),
    "a clock passed through a call": (
        "import time; t0 = time.time()",
        "dt = model(x).sum().item() * (time.time() - t0); t0 = time.time()",
    ),
    "a tuple target": ("import time; t0 = time.time()", "t0, dt = time.time(), 0"),
    "a clock with an argument": (
        "import time; t0 = time.time()",
        "dt = time.time(1); t0 = time.time()",
    ),
    "a loop target": ("import time; t0 = time.time()", "dt = 0\n        for t0 in data: pass"),
}


def _unchecked(setup: str, body: str) -> set[str]:
    plan = analyse(parse("train.py", LOOP.format(setup=setup, body=body)))
    (block,) = plan.blocks
    assert {"t0", "dt"} <= {c.expr for c in block.changeset}, plan.explain()
    return set(block.unchecked)


@pytest.mark.parametrize(("setup", "body"), CLOCKS.values(), ids=list(CLOCKS))
def test_clocks_and_values_made_from_them_are_not_compared(setup: str, body: str) -> None:
    assert _unchecked(setup, body) == {"t0", "dt"}


@pytest.mark.parametrize(("setup", "body"), NOT_CLOCKS.values(), ids=list(NOT_CLOCKS))
def test_what_is_not_only_a_clock_is_compared(setup: str, body: str) -> None:
    assert "dt" not in _unchecked(setup, body)


def test_a_project_module_that_does_not_train_has_no_main_loop() -> None:
    plan = analyse(parse("tok.py", TOKENIZER), module_prefix("tok"))
    assert not plan.main_loops and not plan.blocks, plan.explain()
    assert "nothing in this module trains" in plan.explain()
    # the script's own loops fall back on a nest that does not visibly train: its step may be
    # in a module it imports
    assert analyse(parse("tok.py", TOKENIZER)).main_loops


def test_a_replay_executing_the_batch_loop_is_faithful(tmp_path: Path) -> None:
    """An inner probe executes every batch-loop instance the record checkpointed: the clock
    names differ, and the replay is still exact, says so, and `diff` exits 0."""
    (tmp_path / "tok.py").write_text(TOKENIZER)
    (tmp_path / "corpus.txt").write_text(CORPUS)
    env = {"FLORTRAIN_PERIOD": "every"}
    rep = replay_matches_plain(
        tmp_path, TRAIN, 'print("PROBE", epoch, batch, f"{loss.item():.4f}")', env=env
    )
    assert "differs" not in rep.err and "not faithful" not in rep.err, rep.err
    assert "state equal at 3 checkpoints" in rep.err, rep.err
    store = tmp_path / ".flortrain"
    # the tokenizer's loops ran as plain code: no instance of them in the record
    assert store_count(store, "SELECT COUNT(*) FROM blocks WHERE block_id LIKE 'tok:%'") == 0
    assert (
        store_count(store, "SELECT COUNT(*) FROM blocks WHERE run_id=1 AND state='checkpointed'")
        == 3
    )
    explain = flortrain(tmp_path, "instrument", "--explain", "train.py")
    assert "module tok: no main loop" in explain.out, explain.out
