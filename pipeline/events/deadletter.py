"""Dead letters: rejected events with their raw bytes and reason, for a person to inspect later."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from rankwatch.pipeline.events.records import SourceRef
from rankwatch.pipeline.events.validation import RejectReason


@dataclass(frozen=True)
class DeadLetter:
    """One rejected (or unplaceable) event. ``stream`` is ``"impressions"`` or ``"clicks"``."""

    stream: str
    raw: bytes
    reason: RejectReason
    detail: str
    source: SourceRef | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON-able form: ``raw`` as text when it is UTF-8, else base64 with ``"raw_encoding": "base64"``."""
        try:
            raw, encoding = self.raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            raw, encoding = base64.b64encode(self.raw).decode("ascii"), "base64"
        out: dict[str, Any] = {
            "stream": self.stream,
            "reason": str(self.reason),
            "detail": self.detail,
            "raw": raw,
            "raw_encoding": encoding,
        }
        if self.source is not None:
            out["source"] = {"topic": self.source.topic, "partition": self.source.partition, "offset": self.source.offset}
        return out


class DeadLetterSink(Protocol):
    def send(self, letter: DeadLetter) -> None: ...


class ListDeadLetterSink:
    """Keeps dead letters in memory (tests, small replays)."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    def send(self, letter: DeadLetter) -> None:
        self.letters.append(letter)


class JsonlDeadLetterSink:
    """Appends one JSON line per dead letter to ``path`` (see :meth:`DeadLetter.to_json`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self.count = 0

    def send(self, letter: DeadLetter) -> None:
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(letter.to_json(), ensure_ascii=False) + "\n")
        self.count += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlDeadLetterSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
