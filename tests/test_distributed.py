"""Record and replay under ``torch.distributed`` with more than one process are refused in one
line, exit 2, and leave the store as it was or the run failed (flortrain/process/distributed.py):
under torchrun every rank recorded a run of its own and every rank replayed the latest one."""

from __future__ import annotations

import socket
import sqlite3
import sys
import textwrap
from pathlib import Path

import flortrain as flortrain_pkg
from tests.protocol import flortrain, run

TORCHRUN_SCRIPT = textwrap.dedent(
    """\
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 4) + rank
    for epoch in range(3):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} epoch {epoch} {loss.item():.6f}", flush=True)
    dist.destroy_process_group()
    """
)


def _runs(tmp: Path) -> list[tuple[int, str]]:
    db = tmp / ".flortrain" / "flortrain.db"
    if not db.exists():
        return []
    con = sqlite3.connect(db)
    try:
        return [(i, s) for i, s in con.execute("SELECT id, status FROM runs ORDER BY id")]
    finally:
        con.close()


def _refusals(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if " FT060 " in ln]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_torchrun_ranks_refuse_to_record_and_replay(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TORCHRUN_SCRIPT)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
    ]
    r = run(
        [*torchrun, "-m", "flortrain", "record", "train.py"],
        tmp_path,
        env={"OMP_NUM_THREADS": "1"},
        timeout=120,
    )
    assert r.code != 0 and r.out == "", r.err
    # one line per rank that got to say it (torchrun may stop the other first), naming the script
    lines = _refusals(r.err)
    assert 1 <= len(lines) <= 2, r.err
    assert all(ln.startswith("train.py: FT060 cannot record rank ") for ln in lines), lines
    assert "exitcode  : 2" in r.err, r.err  # what torchrun reports of the rank that refused
    ours = str(Path(flortrain_pkg.__file__).parent)
    assert ours not in r.err, r.err  # torchrun prints a traceback of its own, none of flortrain's
    assert _runs(tmp_path) == []  # nothing recorded
    # a replay under a launcher's environment, with a record to replay: refused before it runs
    one = {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    one["MASTER_PORT"] = str(_free_port())  # a world of one process is recorded as any script
    assert flortrain(tmp_path, "record", "train.py", env=one).code == 0
    rep = flortrain(tmp_path, "replay", "train.py", env={"WORLD_SIZE": "2", "RANK": "1"})
    assert rep.code == 2 and rep.out == "", rep.err
    assert rep.err.splitlines() == [
        "train.py: FT060 cannot replay rank 1 of a torch.distributed run of 2 processes,"
        + rep.err.split("processes,", 1)[1].rstrip("\n")
    ]
    assert _runs(tmp_path) == [(1, "complete")]


SPAWN_SCRIPT = textwrap.dedent(
    """\
    import os
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def train(rank, world):
        try:
            dist.init_process_group("gloo", init_method="file://" + os.path.abspath("rendezvous"),
                                    rank=rank, world_size=world)
        except Exception:
            print("falling back to one process")
        torch.manual_seed(rank)
        w = torch.zeros(3)
        for step in range(3):
            w += torch.randn(3)
        print(f"rank {rank} {w.sum().item():.6f}", flush=True)


    if __name__ == "__main__":
        print("spawning", flush=True)
        mp.spawn(train, args=(2,), nprocs=2)
        print("done")
    """
)


def test_a_world_the_script_starts_itself_is_refused_where_it_starts(tmp_path: Path) -> None:
    """Ranks started by ``torch.multiprocessing.spawn`` (no launcher, no environment): the
    processes it starts refuse at ``init_process_group``, whatever ``except Exception`` surrounds
    it, and the record ends failed with the refusal as its last line, naming the call."""
    (tmp_path / "train.py").write_text(SPAWN_SCRIPT)
    r = flortrain(tmp_path, "record", "train.py")
    assert r.code == 2 and r.out == "spawning\n", r.out + r.err
    last = r.err.splitlines()[-1]
    assert last.startswith(
        "train.py:9:1: FT060 init_process_group starts a torch.distributed run of 2"
    ), r.err
    assert "Traceback" not in r.err and len(_refusals(r.err)) == 1, r.err
    assert _runs(tmp_path) == [(1, "failed")]
