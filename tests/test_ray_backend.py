"""``replay --backend ray``: the correctness protocol with the segments as tasks on a real Ray
cluster, started here on this machine (``ray.init(num_cpus=2)``), which the replay joins.

One fixture has a ``for`` main loop, the other a ``while`` loop; one reads its checkpoints
through an fsspec URL (``--blobs file://...``), as a worker on another machine would read them
from object storage, never opening the driver's SQLite store.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from click.testing import CliRunner

from flortrain.cli import cli
from tests.protocol import copy_fixture, flortrain, plain, probe_lines, record, with_probe

EVERY = {"FLORTRAIN_PERIOD": "every"}


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_backend_replays_exactly(
    cluster: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both fixtures in one test, so that one Ray cluster serves them (starting one is ~15 s)."""
    for name, through_url in (("while_early_stop", False), ("functions_main", True)):
        work = tmp_path / name
        work.mkdir()
        _protocol_on_ray(name, through_url, work, monkeypatch)


def _protocol_on_ray(
    name: str, through_url: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = copy_fixture(name, tmp_path)
    original = script.read_text()
    truth = plain(script)
    rec = record(tmp_path, script.name, env=EVERY)
    assert rec.code == 0 and rec.out == truth.out, rec.err
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLORTRAIN_SEGMENTS", "even")
    blobs = ["--blobs", f"file://{tmp_path}/.flortrain/blobs"] if through_url else []
    for kind in ("inner", "outer"):
        script.write_text(with_probe(original, kind))
        want = probe_lines(plain(script).out)
        r = CliRunner().invoke(
            cli, ["replay", script.name, "--jobs", "2", "--backend", "ray", *blobs]
        )
        assert r.exit_code == 0, r.stderr
        assert "in 2 segments on ray workers" in r.stderr and "worker 2/2 done" in r.stderr, (
            r.stderr
        )
        assert probe_lines(r.stdout) == want
        d = flortrain(tmp_path, "diff")  # the latest replay: the one the Ray workers ran
        assert d.code == 0, d.out + d.err
        if kind == "inner":  # the merged output is the serial replay's, line for line
            serial = flortrain(tmp_path, "replay", script.name)
            assert serial.code == 0 and r.stdout == serial.out, serial.err
