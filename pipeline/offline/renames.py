"""Offline rows in a team's own column names (``rankwatch offline --columns request_id=qid,label=rel``).

Layout: :func:`parse_columns` turns the option's text into a :class:`ColumnMap` (rankwatch field ->
source column), checking it once; :meth:`ColumnMap.names` renames a header (a list of column names) and
:meth:`ColumnMap.frame` a pandas frame, :meth:`ColumnMap.missing` names a mapped column a file lacks.

Why a rename at the readers and nothing else: every engine (in-memory, streaming, spill files, Spark)
validates and scores frames whose columns carry rankwatch's names, so renaming where a file's columns are
first seen keeps one validation and one kernel for all of them. A column whose name is a mapped field but
that is not itself a source (``label`` in a file read with ``--columns label=rel``) is dropped: it is not
the label the user asked for, and keeping it would give the frame two ``label`` columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import pandas as pd

from rankwatch.pipeline.slicing import SLICE_LABELS

FIELDS: tuple[str, ...] = ("request_id", "item_id", "score", "label", "position", *SLICE_LABELS, "user_id")


@dataclass(frozen=True)
class ColumnMap:
    """``fields[rankwatch field] = source column``; the empty map reads columns as they are named."""

    fields: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.fields)

    @property
    def _renames(self) -> dict[str, str]:
        return {source: name for name, source in self.fields.items()}

    def _shadowed(self) -> set[str]:
        return set(self.fields) - set(self.fields.values())

    def names(self, columns: Iterable[str]) -> list[str]:
        """The columns of a header as rankwatch names them (shadowed names dropped)."""
        renames, shadowed = self._renames, self._shadowed()
        return [renames.get(c, c) for c in columns if c not in shadowed]

    def frame(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` with its mapped columns renamed (no copy of the data when nothing changes)."""
        if not self.fields:
            return frame
        shadowed = self._shadowed()
        if shadowed & set(frame.columns):
            frame = frame[[c for c in frame.columns if c not in shadowed]]
        return frame.rename(columns=self._renames)

    def missing(self, columns: Iterable[str]) -> str | None:
        """The first mapped source column not among ``columns`` (a file's own names), as a message."""
        present = set(columns)
        for name, source in self.fields.items():
            if source not in present:
                return f"no column {source!r} for {name} (--columns {name}={source})"
        return None

    def source(self, name: str) -> str:
        """The file's column that holds rankwatch field ``name``."""
        return self.fields.get(name, name)


def parse_columns(text: str | None) -> ColumnMap:
    """``"request_id=qid,label=rel"`` -> :class:`ColumnMap`; ``ValueError`` naming the first problem
    (not ``field=column``, a field rankwatch's offline rows do not have, a field or a column named twice)."""
    if not text or not text.strip():
        return ColumnMap()
    fields: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, source = (s.strip() for s in part.partition("="))
        if not sep or not name or not source:
            raise ValueError(f"--columns takes rankwatch_field=column pairs, got {part!r}")
        if name not in FIELDS:
            raise ValueError(f"--columns: unknown rankwatch field {name!r} (fields: {', '.join(FIELDS)})")
        if name in fields:
            raise ValueError(f"--columns: field {name!r} is mapped twice")
        if source in fields.values():
            raise ValueError(f"--columns: column {source!r} is the target of two fields")
        fields[name] = source
    return ColumnMap({n: s for n, s in fields.items() if n != s})
