"""``torch.backends.cudnn.benchmark = True``: cuDNN picks its algorithms by timing, run by run."""

from __future__ import annotations

from collections.abc import Iterator

from flortrain.check import gpu
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit


class CudnnBenchmark(Rule):
    code = f"{Family.DETERMINISM}004"
    name = "cudnn-benchmark"
    severity = Severity.WARNING
    message = "cudnn.benchmark = True picks convolution algorithms by timing, differently each run"
    hint = "set torch.backends.cudnn.benchmark = False for reproducible runs"
    doc = (
        "With `torch.backends.cudnn.benchmark = True` cuDNN times the candidate algorithms for"
        " each convolution shape and keeps the fastest, so which algorithm runs, and the bits"
        " it produces, depend on timing noise. Beside `cudnn.deterministic = True` or"
        " `torch.use_deterministic_algorithms(True)` it contradicts what the script asks for"
        " (an error); in a file that uses CUDA it is a warning; elsewhere it is not reported. What"
        " the pass cannot know: a flag set from a variable (`cudnn.benchmark = args.fast`) is"
        " taken as possibly true, and a flag set by a library is not seen."
    )
    valid = (
        Valid("import torch\ntorch.backends.cudnn.benchmark = False\nx = torch.ones(1).cuda()\n"),
        Valid("import torch\ntorch.backends.cudnn.benchmark = True\n"),
    )
    invalid = (
        Invalid(
            "import torch\ntorch.backends.cudnn.deterministic = True\n"
            "torch.backends.cudnn.benchmark = True\n",
            line=3,
        ),
        Invalid(
            "import torch\nfrom torch.backends import cudnn\ncudnn.benchmark = True\n"
            "model = torch.nn.Conv2d(3, 3, 3).cuda()\n",
            line=3,
        ),
        Invalid(
            "import torch\nfrom setup import deterministic\ndeterministic()\n"
            "torch.backends.cudnn.benchmark = True\n",
            line=4,
            files=(
                (
                    "setup.py",
                    "import torch\n\n\ndef deterministic():\n"
                    "    torch.use_deterministic_algorithms(True)\n",
                ),
            ),
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        benchmark = [s for s, v in gpu.cudnn_flags(unit, "benchmark") if v is not False]
        if not benchmark:
            return
        deterministic = [s for s, v in gpu.cudnn_flags(unit, "deterministic") if v is not False]
        mode = gpu.deterministic_mode(unit)
        if not deterministic and mode is not None and not mode.warn_only:
            deterministic = [mode.step]
        for step in benchmark:
            if deterministic:
                other = deterministic[0]
                yield Hit(
                    step.anchor,
                    message="cudnn.benchmark = True contradicts the deterministic setting at"
                    f" line {gpu.line_of(unit, other)}: cuDNN still picks algorithms by timing",
                    severity=Severity.ERROR,
                )
            elif unit.uses_cuda:
                yield Hit(step.anchor)
