"""The optional C helpers of the streaming core, or None where they are not built or are turned off.

Layout: :data:`rowscan` (pipeline/stream/_rowscan.c: the usual JSON event scanned into its batch-path row),
:data:`fastapply` (pipeline/stream/_fastapply.c: the batch path's common event applied) and :data:`labels`
(pipeline/stream/_labels.c: the finalize step's label matching). setup.py builds them where a C compiler is
found; ``RANKWATCH_NATIVE=off`` turns them off.

Why optional: each replaces a Python loop that stays beside it, as its fallback and as its oracle in the tests
(tests/pipeline/stream/test_rowscan.py, test_labels.py, test_stream_batch.py), so an install without a compiler computes the same
results, only slower (docs/benchmarks.md has by how much).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType


def _built(name: str) -> ModuleType | None:
    """The C module ``name`` of this package, or None where it was not built (no compiler at install)."""
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError:
        return None


_OFF = os.environ.get("RANKWATCH_NATIVE", "").strip().lower() in ("0", "off", "no", "false")
rowscan: ModuleType | None = None if _OFF else _built("_rowscan")
labels: ModuleType | None = None if _OFF else _built("_labels")
fastapply: ModuleType | None = None if _OFF else _built("_fastapply")
