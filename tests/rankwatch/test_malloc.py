"""``keep_freed_blocks``: the metric kernel's temporaries of about 1 MB are reused, not mapped and faulted in each time."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROBE = """
import resource, sys
import numpy as np
from rankwatch.malloc import keep_freed_blocks
from rankwatch.pipeline.metrics.aggregates import aggregate_lists
from rankwatch.pipeline.metrics.options import MetricOptions
if sys.argv[1] == "kept":
    assert keep_freed_blocks()
rng = np.random.default_rng(1)
n = 6000  # a staged group's requests, 20 items each: the kernel's temporaries are about 1 MB
offsets, scores = np.arange(0, 20 * n + 1, 20), rng.random(20 * n)
labels, slices, users = (rng.random(20 * n) < 0.1).astype(float), rng.integers(0, 6, n), rng.integers(0, 3000, n)
kernel = lambda: aggregate_lists(labels, scores, offsets, slices, 6, MetricOptions(), gauc_keys=users, gauc_open=True)
kernel()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    kernel()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_kernels_temporaries_are_reused_not_faulted_in_again() -> None:
    """Ten kernel calls on a staged group of 120k items: about 2,400 page faults each by default (glibc maps,
    touches and unmaps temporaries of its size), a few once the thresholds keep freed blocks in the heap."""
    default, kept = _faults("default"), _faults("kept")
    assert default > 10 * 1000
    assert kept < default / 20
