"""Durations written as text (``"30s"``, ``"5m"``): :func:`parse_duration_ms`, and
:func:`parse_duration_or_zero_ms` where zero is allowed.

A module of its own so that reading a configuration imports no metric code: ``rankwatch replay`` starts
its log reader's process before the core's modules (the metric code, numpy) are loaded.
"""

from __future__ import annotations

import re

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration_ms(text: str) -> int:
    """``"30s"``, ``"5m"``, ``"1h"``, ``"1d"`` (also ``"250ms"``) to milliseconds; ``ValueError`` otherwise."""
    m = _DURATION.match(text)
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h, 1d)")
    return int(m.group(1)) * _UNITS_MS[m.group(2)]


def parse_duration_or_zero_ms(text: str) -> int:
    """:func:`parse_duration_ms`, or 0 for zero written as ``"0"``, ``"0s"``, ``"0ms"``... (a disorder of none,
    a wait switched off)."""
    return 0 if re.fullmatch(r"\s*0\s*(ms|s|m|h|d)?\s*", text) else parse_duration_ms(text)
