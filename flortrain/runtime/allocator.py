"""A steady heap for the training a replay re-executes.

glibc's malloc serves a block larger than its mmap threshold with a fresh mapping and unmaps it
when it is freed; it also gives the top of its heap back to the kernel once enough of it is
free. CPU training frees and allocates the same large tensors at every step (gradients set to
None by ``zero_grad``, activations, an optimizer's temporaries), so each step touches fresh
pages, and every page's first touch is a fault the kernel serves by zeroing it: on CPU those
faults can take a large share of an epoch (docs/benchmarks.md).

A replay re-executes exactly the training the user is waiting for, so it sets glibc's two
thresholds (:func:`steady`) as it starts: large blocks come from the heap, and freed memory
stays in it for the next step. The results do not change. The values computed do not depend on
where a tensor lives: torch aligns every CPU allocation to 64 bytes wherever malloc takes it
from (``c10::alloc_cpu``), and the replay's output is checked against the record's
(``flortrain diff``). What changes is the process's resident memory: it stays at its
peak instead of shrinking between steps.

Record does not do this. A recorded run should use the machine as ``python script.py`` does,
and the record-overhead benchmark compares the two with both allocators alike
(``--steady-allocator``). ``FLORTRAIN_REPLAY_ALLOCATOR=default`` turns it off for a replay.
Elsewhere than glibc on Linux it does nothing.
"""

from __future__ import annotations

import ctypes
import sys

from flortrain import knobs

#: ``<malloc.h>``: the parameters ``mallopt`` sets
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): blocks up to it
#: come from the heap
MMAP_THRESHOLD = 32 << 20
#: free memory at the heap's top kept rather than given back
TRIM_THRESHOLD = 1 << 30


def steady() -> bool:
    """Keep large blocks on glibc's heap and freed memory in it, for this process; whether it
    took effect (False off Linux, without glibc's ``mallopt``, or when the knob says so)."""
    if knobs.replay_allocator() != "steady" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; musl's stub returns 0 and changes nothing
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    )
