"""Operations that raise under deterministic mode: training would crash where they first run."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import gpu, ops
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit


class RaisesUnderDeterministicMode(Rule):
    code = f"{Family.DETERMINISM}002"
    name = "raises-under-deterministic-mode"
    severity = Severity.WARNING
    cuda_error = True
    message = "operation that raises under torch.use_deterministic_algorithms(True)"
    hint = "pass warn_only=True to torch.use_deterministic_algorithms, or replace the operation"
    doc = (
        "Under `torch.use_deterministic_algorithms(True)` an operation with no deterministic"
        " implementation raises `RuntimeError` when it runs: `CTCLoss` and adaptive pooling"
        " backward, bilinear `interpolate` backward, `histc`, `bincount` with weights,"
        " `cumsum` and `NLLLoss` on CUDA, `MaxUnpool` and `put_` everywhere, per torch's"
        " documentation of the configured torch release. A run that enables the"
        " mode at start-up then crashes at the first backward on the GPU, possibly hours in;"
        " `warn_only=True` keeps the run going with a warning and the op nondeterministic. A"
        " warning, an error in files that use CUDA and for operations that raise on every"
        " device. What the pass cannot know: whether the call runs on CUDA, whether its"
        " backward runs (an op under `torch.no_grad()` never raises for its backward), and a"
        " tensor's dtype (`cumsum` on integers does not raise)."
    )
    valid = (
        Valid(
            "import torch\nimport torch.nn as nn\n"
            "torch.use_deterministic_algorithms(True, warn_only=True)\nloss = nn.CTCLoss()\n"
        ),
        Valid("import torch\nimport torch.nn as nn\nloss = nn.CTCLoss()\n"),
        Valid(
            "import torch\ntorch.use_deterministic_algorithms(True)\n"
            "h = torch.bincount(torch.tensor([1, 1]))\n"
        ),
    )
    invalid = (
        Invalid(
            "import torch\nimport torch.nn as nn\n"
            "torch.use_deterministic_algorithms(True)\nloss = nn.CTCLoss()\n",
            line=4,
            col=8,
        ),
        Invalid(
            "import torch\nimport torch.nn.functional as F\n\n\ndef up(x):\n"
            "    return F.interpolate(x, size=(8, 8), mode='bicubic')\n\n\n"
            "def main():\n    torch.use_deterministic_algorithms(True)\n    up(torch.ones(1, 1, 4, 4))\n\n\n"
            "if __name__ == '__main__':\n    main()\n",
            line=6,
            col=12,
        ),
        Invalid(
            "import torch\ntorch.use_deterministic_algorithms(mode=True)\n"
            "counts = torch.zeros(3).cuda().histc(bins=3)\n",
            line=3,
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        mode = gpu.deterministic_mode(unit)
        if mode is None or mode.warn_only:
            return
        at = gpu.line_of(unit, mode.step)
        for call in unit.calls:
            for op, spelled in ops.matches(unit, call):
                if not op.raises:
                    continue
                where = op.where()
                yield Hit(
                    call,
                    message=f"raises{' ' + where if where else ''} under deterministic mode"
                    f" (line {at}): {op.describe(spelled)}, no deterministic version",
                    severity=Severity.WARNING
                    if op.caveat
                    else Severity.ERROR
                    if op.device == "any"
                    else None,
                )
                break
