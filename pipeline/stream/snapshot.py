"""Snapshot format of :class:`pipeline.stream.processor.StreamProcessor`: versioned msgpack (msgspec).

A snapshot is ``{"format": "rankwatch-stream", "version": 1, "config": {...}, "state": {...}}``. The
``config`` part holds the settings the state's meaning depends on (window sizes, attribution window,
finalization step, slice labels, metric options); restoring under different ones raises
:class:`ConfigChanged` naming every difference (the service then starts that pair fresh from the
checkpoint's offsets: docs/config-changes.md), while caps and timeouts may change between runs.
"""

from __future__ import annotations

from typing import Any

import msgspec

FORMAT = "rankwatch-stream"
VERSION = 1


class SnapshotError(ValueError):
    """The bytes are not a snapshot this version can restore, or were made under an incompatible config."""


class ConfigChanged(SnapshotError):
    """The snapshot was taken under other settings its meaning depends on; ``changes`` names each one."""

    def __init__(self, changes: list[str]) -> None:
        super().__init__("snapshot was taken with " + "; ".join(changes))
        self.changes = list(changes)

    def __reduce__(self) -> tuple[object, ...]:  # crosses the core process boundary by pickle
        return (type(self), (self.changes,))


def encode_snapshot(config: dict[str, Any], state: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode({"format": FORMAT, "version": VERSION, "config": config, "state": state})


def decode_snapshot(data: bytes, config: dict[str, Any]) -> dict[str, Any]:
    """The state of a snapshot, after checking its format, version and config."""
    try:
        doc = msgspec.msgpack.decode(data)
    except msgspec.DecodeError as e:
        raise SnapshotError(f"not a snapshot: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError("not a rankwatch stream snapshot")
    if doc.get("version") != VERSION:
        # Another release's format: the pair starts fresh from the checkpoint's offsets, as after a change of
        # the settings (docs/upgrading.md), rather than the service failing on every assignment.
        raise ConfigChanged([f"snapshot format version={doc.get('version')!r}, this release reads {VERSION}"])
    saved = doc["config"]
    changes = [f"{key}={saved.get(key)!r}, now {value!r}" for key, value in config.items() if saved.get(key) != value]
    if changes:
        raise ConfigChanged(changes)
    state: dict[str, Any] = doc["state"]
    return state
