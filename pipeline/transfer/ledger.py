"""The transfer ledger: one JSON line per comparison of a candidate model against a reference.

Layout: :class:`Difference` (a difference with its standard error and its count) and :class:`LedgerEntry`
(one line), validated on construction; :func:`parse_ledger_line` (text -> entry, errors name the file and
line); :func:`entry_to_line` (entry -> text, the inverse); :func:`read_ledgers` (files -> entries, plain or
gzip); :func:`append_to_ledger` (entries -> the end of a file); :func:`latest_entries` (a comparison recorded
more than once counts once, at its latest ``recorded_at``).

A line (SPEC section 7)::

    {"experiment": "ranker-v13", "candidate": "v13", "reference": "v12", "segment": "new_user",
     "surface": "search", "metric": "ndcg@10", "online_metric": "ndcg@10",
     "offline": {"diff": 0.012, "stderr": 0.003, "n": 48210},
     "online": {"diff": 0.004, "stderr": 0.002, "n": 913000},
     "recorded_at": "2026-12-01T10:00:00Z"}

``online_metric`` may be missing or null: it is then ``metric``. Unknown keys are ignored (the format may
grow). Why validate here: a ledger accumulates over months from several writers; a bad line should stop
the reader with its file and line, not surface later as a NaN in a slope. ``recorded_at`` is an RFC 3339
string given by the writer; nothing here reads the clock.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec

from rankwatch.pipeline.errors import RankwatchError

__all__ = [
    "Difference",
    "LedgerEntry",
    "LedgerError",
    "append_to_ledger",
    "comparison_key",
    "entry_to_line",
    "latest_entries",
    "parse_ledger_line",
    "read_ledgers",
]

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_TEXT_FIELDS = ("experiment", "candidate", "reference", "segment", "surface", "metric")


class LedgerError(RankwatchError, ValueError):
    """A ledger file is missing or a line is malformed; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class Difference:
    """A difference candidate - reference with its standard error ``stderr >= 0`` over ``n >= 1`` units."""

    diff: float
    stderr: float
    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or isinstance(self.n, bool) or self.n < 1:
            raise ValueError(f"n must be a positive integer, got {self.n!r}")
        for name in ("diff", "stderr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            object.__setattr__(self, name, float(value))
        if self.stderr < 0:
            raise ValueError(f"stderr must be >= 0, got {self.stderr!r}")


@dataclass(frozen=True, kw_only=True)
class LedgerEntry:
    """One comparison: candidate against reference in one (segment, surface) slice for one metric.

    ``offline.diff`` is paired over the requests both models scored; ``online.diff`` comes from the A/B
    test. ``online_metric`` defaults to ``metric`` (``None`` is replaced on construction).
    """

    experiment: str
    candidate: str
    reference: str
    segment: str
    surface: str
    metric: str
    offline: Difference
    online: Difference
    recorded_at: str
    online_metric: str | None = field(default=None)

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if self.online_metric is None:
            object.__setattr__(self, "online_metric", self.metric)
        elif not isinstance(self.online_metric, str) or not self.online_metric:
            raise ValueError(f"online_metric must be a non-empty string or null, got {self.online_metric!r}")
        for name in ("offline", "online"):
            if not isinstance(getattr(self, name), Difference):
                raise ValueError(f"{name} must be a Difference")
        recorded_at_instant(self.recorded_at)


def recorded_at_instant(text: str) -> datetime:
    """The instant an RFC 3339 timestamp names (a zone is required: ``Z`` or ``+hh:mm``); ValueError if not."""
    if not isinstance(text, str) or not _RFC3339.fullmatch(text):
        raise ValueError(f"recorded_at must be an RFC 3339 timestamp with a zone, got {text!r}")
    try:
        return datetime.fromisoformat(text.upper().replace("Z", "+00:00").replace(" ", "T"))
    except ValueError:
        raise ValueError(f"recorded_at is not a valid instant: {text!r}") from None


_DECODER = msgspec.json.Decoder(LedgerEntry)


def parse_ledger_line(line: str | bytes, *, source: str = "<ledger>", line_number: int = 1) -> LedgerEntry:
    """One ledger line -> :class:`LedgerEntry`; :class:`LedgerError` ``"source:line: why"`` otherwise."""
    try:
        return _DECODER.decode(line)
    except msgspec.ValidationError as e:
        raise LedgerError(f"{source}:{line_number}: {_describe(e)}") from None
    except msgspec.DecodeError as e:
        raise LedgerError(f"{source}:{line_number}: not a JSON object: {e}") from None


def _describe(e: msgspec.ValidationError) -> str:
    """msgspec says ``Object missing required field `x` - at `$.offline```; make it read as a sentence."""
    text = str(e).replace("`", "")
    message, _sep, where = text.partition(" - at ")
    where = where.removeprefix("$").lstrip(".")
    return f"{where}: {message}" if where else message


def entry_to_line(entry: LedgerEntry) -> str:
    """The ledger line of ``entry`` (no trailing newline), keys in the order of SPEC section 7."""
    doc: dict[str, Any] = {name: getattr(entry, name) for name in _TEXT_FIELDS}
    doc["online_metric"] = entry.online_metric
    for name in ("offline", "online"):
        d: Difference = getattr(entry, name)
        doc[name] = {"diff": d.diff, "stderr": d.stderr, "n": d.n}
    doc["recorded_at"] = entry.recorded_at
    return json.dumps(doc, allow_nan=False, ensure_ascii=False)


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as raw:
        magic = raw.read(2)
    opener: Any = gzip.open if magic == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        yield from enumerate(f, start=1)


def read_ledgers(paths: Iterable[str | os.PathLike[str]]) -> list[LedgerEntry]:
    """Every entry of the ledger files, in file then line order (blank lines skipped; ``.gz`` read as such).

    Raises :class:`LedgerError` naming the file (missing, unreadable) or ``file:line`` (malformed).
    """
    entries: list[LedgerEntry] = []
    for path in paths:
        name = os.fspath(path)
        p = Path(name)
        if not p.is_file():
            raise LedgerError(f"{name}: no such ledger file")
        number = 0
        try:
            for number, line in _lines(p):
                if line.strip():
                    entries.append(parse_ledger_line(line, source=name, line_number=number))
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise LedgerError(f"{name}:{number + 1}: cannot read: {e}") from None
    return entries


def append_to_ledger(path: str | os.PathLike[str], entries: Iterable[LedgerEntry]) -> int:
    """Append one line per entry to ``path`` (created if missing); returns the number of lines written."""
    text = "".join(entry_to_line(e) + "\n" for e in entries)
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)
    return text.count("\n")


def comparison_key(entry: LedgerEntry) -> tuple[str, ...]:
    """What identifies a comparison: experiment, candidate, reference, segment, surface and both metrics."""
    return (entry.experiment, entry.candidate, entry.reference, entry.segment, entry.surface, entry.metric,
            entry.online_metric or entry.metric)  # fmt: skip


def latest_entries(entries: Iterable[LedgerEntry]) -> list[LedgerEntry]:
    """One entry per :func:`comparison_key`: the latest ``recorded_at`` (the later line on a tie).

    A ledger is appended to; a comparison re-recorded (``rankwatch ab`` run again on more data) supersedes
    its earlier lines instead of counting twice. Order: first appearance of each key.
    """
    chosen: dict[tuple[str, ...], LedgerEntry] = {}
    for entry in entries:
        key = comparison_key(entry)
        old = chosen.get(key)
        if old is None or recorded_at_instant(entry.recorded_at) >= recorded_at_instant(old.recorded_at):
            chosen[key] = entry
    return list(chosen.values())
