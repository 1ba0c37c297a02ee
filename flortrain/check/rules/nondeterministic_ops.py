"""Operations torch documents as nondeterministic, used without deterministic mode."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import gpu, ops
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit


class NondeterministicOp(Rule):
    code = f"{Family.DETERMINISM}001"
    name = "nondeterministic-op"
    severity = Severity.WARNING
    cuda_error = True
    message = "operation nondeterministic on GPU without torch.use_deterministic_algorithms(True)"
    hint = "call torch.use_deterministic_algorithms(True) before training (warn_only=True where an op has no deterministic version)"
    doc = (
        "Scatter-adds, `index_add_`, `index_put`, adaptive pooling and interpolation backward,"
        " cuDNN convolutions and the other operations torch's documentation of"
        " `use_deterministic_algorithms` lists use atomic adds or algorithm choices whose"
        " order changes from run to run on a GPU, so two runs of the same seeded script differ"
        " in the last bits and a replay cannot be bit-identical. The lists are data, one file"
        " per torch release (`flortrain/check/data/torch-X.Y.json`), chosen by the configured"
        " torch version (the newest list not newer than it), never by importing torch;"
        " convolutions are also made deterministic by `torch.backends.cudnn.deterministic ="
        " True`. A warning, an error in files that use CUDA. What the static pass cannot know: where a tensor lives (an op listed for CUDA"
        " is reported whether or not that call runs on the GPU), whether its backward runs,"
        " a tensor's dtype, and the type of a method's receiver (`.cumsum()` on a NumPy array"
        " or a DataFrame looks like the tensor method); `bmm` on sparse tensors,"
        " `__getitem__` backward and `resize_` on quantized tensors are not spelled in a way the"
        " text shows, so they are not reported."
    )
    valid = (
        Valid(
            "import torch\ntorch.use_deterministic_algorithms(True)\n"
            "x = torch.zeros(3).index_add_(0, torch.tensor([0, 0]), torch.ones(2))\n"
        ),
        Valid("import torch\nh = torch.bincount(torch.tensor([1, 1]))\n"),
        Valid(
            "import torch\nimport torch.nn as nn\ntorch.backends.cudnn.deterministic = True\n"
            "conv = nn.Conv2d(3, 8, 3)\n"
        ),
        Valid("import numpy as np\nimport torch\ny = np.cumsum(np.ones(3))\n"),
        Valid(
            "import torch.nn.functional as F\n\n\ndef up(x):\n"
            "    return F.interpolate(x, scale_factor=2)\n"
        ),
    )
    invalid = (
        Invalid(
            "import torch\nx = torch.zeros(3).cuda()\nx.index_add_(0, torch.tensor([0, 0]), torch.ones(2))\n",
            line=3,
        ),
        Invalid(
            "import torch\nx = torch.zeros(3)\nx.index_put_((torch.tensor([0]),), torch.ones(1), accumulate=True)\n",
            line=3,
        ),
        Invalid("import torch.nn as nn\nloss = nn.CTCLoss()\n", line=2, col=8),
        Invalid(
            "import torch.nn.functional as F\n\n\ndef up(x):\n"
            "    return F.interpolate(x, scale_factor=2, mode='bilinear')\n",
            line=5,
            col=12,
        ),
        Invalid(
            "import torch\nh = torch.bincount(torch.tensor([1]), weights=torch.ones(1))\n", line=2
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        if gpu.deterministic_mode(unit) is not None:
            return
        cudnn = any(v is not False for _, v in gpu.cudnn_flags(unit, "deterministic"))
        for call in unit.calls:
            for op, spelled in ops.matches(unit, call):
                if op.cudnn and cudnn:
                    continue
                if op.raises:
                    tail = "it has no deterministic version (deterministic mode would raise)"
                elif op.cudnn:
                    tail = "deterministic under torch.use_deterministic_algorithms(True) or cudnn.deterministic"
                else:
                    tail = "deterministic under torch.use_deterministic_algorithms(True)"
                where = op.where()
                yield Hit(
                    call,
                    message=f"nondeterministic{' ' + where if where else ''}:"
                    f" {op.describe(spelled)}; {tail}",
                    severity=Severity.WARNING if op.caveat else None,
                )
                break
