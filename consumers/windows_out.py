"""``--windows-out``: one JSON line per published window, each identity written once.

A window can be handed over again after a crash (it was published, the process died before the next
checkpoint, the restored state publishes it again with the same identity and content). The writer reads
the identities already in the file when it opens it and skips a republication, so the file holds every
window exactly once across restarts. A line cut short by a crash (no final newline) is dropped on open:
its window will be published again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from rankwatch.pipeline.published import PublishedWindow

Identity = tuple[str, str, tuple[int, ...]]


def document_identity(doc: dict[str, Any]) -> Identity:
    """``(window, start, partitions)`` of a ``--windows-out`` line."""
    return (str(doc["window"]), str(doc["start"]), tuple(int(p) for p in doc.get("partitions", ())))


def read_windows(path: str | Path) -> list[dict[str, Any]]:
    """Every complete line of a windows file (a trailing partial line is ignored)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n") and line.strip():
                out.append(json.loads(line))
    return out


class WindowsOutWriter:
    """Appends window documents to ``path``, skipping identities it already holds (same or older revision)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.seen: dict[Identity, int] = {}
        self.skipped = 0
        if self.path.exists():
            self._recover()
        self._file: IO[str] = self.path.open("a", encoding="utf-8")

    def _recover(self) -> None:
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut != len(data):  # a partial last line from a crash: drop it, the window comes again
            with self.path.open("r+b") as f:
                f.truncate(cut)
        for line in data[:cut].decode("utf-8").splitlines():
            if line.strip():
                doc = json.loads(line)
                self.seen[document_identity(doc)] = int(doc.get("revision", 0))

    def write(self, window: PublishedWindow) -> bool:
        """Append ``window`` unless its identity is already written; True when written."""
        doc = window.document()
        identity = document_identity(doc)
        if identity in self.seen and window.revision <= self.seen[identity]:
            self.skipped += 1
            return False
        self._file.write(json.dumps(doc, separators=(",", ":")) + "\n")
        self._file.flush()
        self.seen[identity] = window.revision
        return True

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
