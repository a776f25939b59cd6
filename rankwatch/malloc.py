"""The C allocator's thresholds for a batch job whose numpy temporaries are a few MB each (glibc only).

:func:`keep_freed_blocks` raises glibc's mmap threshold to :data:`MMAP_THRESHOLD` and its trim threshold to
:data:`TRIM_THRESHOLD` (``mallopt``), where the C library has them; elsewhere it does nothing.

Why: glibc serves a block of 128 KiB or more with its own ``mmap`` and unmaps it when freed (the threshold grows
with the blocks freed, but the heap's top is trimmed again past twice that). The metric kernel makes dozens of
temporaries of about 1 MB per staged group (120k items of float64), and the result document some of 16 MB:
each was mapped, touched page by page (a fault each 4 KiB) and unmapped. In a 100k-request replay that was
about 95,000 of its 207,000 page faults and 0.15 s of system time, with 0.1 s more of user time in the faults'
wake; with the thresholds above, freed blocks stay in the heap and are reused (docs/benchmarks.md). The cost is
memory the process keeps after freeing it: at most :data:`TRIM_THRESHOLD` at the heap's top, which a batch job
(``rankwatch replay``) does not mind. Forked children (the replay's log reader and window worker) inherit it.
"""

from __future__ import annotations

import ctypes
import sys

MMAP_THRESHOLD = 8 << 20  # blocks from this size on get their own mapping (glibc's default starts at 128 KiB)
TRIM_THRESHOLD = 32 << 20  # free memory at the heap's top kept for reuse rather than returned
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def keep_freed_blocks() -> bool:
    """Set the thresholds (module docstring); True where they were set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no such symbol to bind, or a stub)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; both or neither (the trim threshold alone would pin the mmap one at 128 KiB)
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
