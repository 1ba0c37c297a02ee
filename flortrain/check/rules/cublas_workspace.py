"""Deterministic mode without CUBLAS_WORKSPACE_CONFIG, or with it set after CUDA started."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import gpu
from flortrain.check.finding import Severity
from flortrain.check.flow import steps
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit


class CublasWorkspace(Rule):
    code = f"{Family.DETERMINISM}003"
    name = "cublas-workspace-config"
    severity = Severity.WARNING
    cuda_error = True
    message = "deterministic mode without CUBLAS_WORKSPACE_CONFIG set before CUDA starts"
    hint = (
        'set os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8") before the first CUDA call'
    )
    doc = (
        "cuBLAS (CUDA 10.2 and later) is deterministic only with `CUBLAS_WORKSPACE_CONFIG=:4096:8`"
        " (or `:16:8`) in the environment; under `torch.use_deterministic_algorithms(True)`"
        " without it, `mm`, `bmm` and `mv` on CUDA raise. cuBLAS reads the variable when CUDA"
        " creates its handle, so setting it after the script's first `.cuda()`, `.to('cuda')`"
        " or `torch.cuda` call is too late. Lightning's `Trainer(deterministic=True)` and"
        " transformers' `enable_full_determinism` set it themselves. What the static pass"
        " cannot know: the shell's environment (a variable exported by the launcher is"
        " invisible: `os.environ.setdefault` keeps it and satisfies the rule); a script that"
        " names the variable elsewhere (an `assert` on it) is trusted; CUDA started by a library"
        " or through a device the text does not name (`.to(args.device)`) is not seen."
    )
    valid = (
        Valid(
            "import os\nos.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'\nimport torch\n"
            "torch.use_deterministic_algorithms(True)\nx = torch.ones(2).cuda()\n"
        ),
        Valid("import torch\nx = torch.ones(2).cuda()\n"),
        Valid(
            "import os\nimport torch\n\n\ndef setup():\n"
            "    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':16:8')\n"
            "    torch.use_deterministic_algorithms(True)\n\n\nsetup()\nx = torch.ones(2).cuda()\n"
        ),
        Valid("import lightning as L\nimport torch\ntrainer = L.Trainer(deterministic=True)\n"),
    )
    invalid = (
        Invalid(
            "import torch\ntorch.use_deterministic_algorithms(True)\nx = torch.ones(2).cuda()\n",
            line=2,
        ),
        Invalid(
            "import os\nimport torch\ndevice = torch.device('cuda')\n"
            "model = torch.nn.Linear(2, 2).to(device)\n"
            "os.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'\n"
            "torch.use_deterministic_algorithms(True)\n",
            line=5,
        ),
        Invalid(
            "import torch\nimport setup\nmodel = torch.nn.Linear(2, 2).cuda()\nsetup.deterministic()\n",
            line=4,
            files=(
                (
                    "setup.py",
                    "import os\nimport torch\n\n\ndef deterministic():\n"
                    "    os.environ['CUBLAS_WORKSPACE_CONFIG'] = ':4096:8'\n"
                    "    torch.use_deterministic_algorithms(True)\n",
                ),
            ),
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        path = steps(unit)
        mode = gpu.deterministic_mode(unit)
        cuda = next((i for i, s in enumerate(path) if s.reached and gpu.starts_cuda(s)), None)
        cublas = next((i for i, s in enumerate(path) if gpu.sets_cublas(s)), None)
        if cublas is not None:
            if cuda is not None and cuda < cublas and path[cublas].reached:
                yield Hit(
                    path[cublas].anchor,
                    message=f"{gpu.CUBLAS} set after CUDA started (line"
                    f" {gpu.line_of(unit, path[cuda])}): cuBLAS has read the environment already",
                )
            return
        if mode is None or mode.sets_cublas or gpu.CUBLAS in unit.text:
            return
        yield Hit(mode.step.anchor)
