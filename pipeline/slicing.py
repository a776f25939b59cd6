"""Slices (SPEC section 3): which labels a result is split by, and caps on their distinct values."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

SLICE_LABELS: tuple[str, ...] = ("segment", "surface", "variant", "model")
DEFAULT_SLICE_BY: tuple[str, ...] = ("segment", "surface")
UNKNOWN_VALUE = "unknown"  # an impression without the label
OVERFLOW_VALUE = "__other__"  # values past the per-label cap
ALL_VALUE = "all"  # a label the slice does not split on (Prometheus)

# A slice is identified by its (label, value) pairs in SLICE_LABELS order; () is the overall slice.
SliceKey = tuple[tuple[str, str], ...]
OVERALL: SliceKey = ()


@dataclass(frozen=True)
class SliceSpec:
    """How results are sliced.

    ``by`` lists the labels every slice splits on (default segment x surface); the overall slice always
    exists. ``max_values_per_label`` caps the distinct values kept per label; later values fold into
    ``"__other__"`` and are counted.
    """

    by: tuple[str, ...] = DEFAULT_SLICE_BY
    max_values_per_label: int = 50

    def __post_init__(self) -> None:
        unknown = [b for b in self.by if b not in SLICE_LABELS]
        if unknown:
            raise ValueError(f"cannot slice by {unknown[0]!r}; choose from {', '.join(SLICE_LABELS)}")
        if len(set(self.by)) != len(self.by):
            raise ValueError("slice labels must not repeat")
        if self.max_values_per_label < 1:
            raise ValueError("max_values_per_label must be >= 1")
        # Keep canonical order so keys are comparable across processes.
        object.__setattr__(self, "by", tuple(lbl for lbl in SLICE_LABELS if lbl in self.by))

    def key(self, labels: dict[str, str]) -> SliceKey:
        return tuple((lbl, labels.get(lbl, UNKNOWN_VALUE)) for lbl in self.by)


class LabelCapper:
    """Keeps the first ``max_values`` distinct values of each label; maps the rest to ``__other__``.

    First come, first kept: a value once admitted stays admitted, so a series never changes its name.
    ``overflow[label]`` counts the events whose value was folded.
    """

    def __init__(self, max_values: int = 50) -> None:
        self.max_values = max_values
        self.admitted: dict[str, set[str]] = {}
        self.overflow: dict[str, int] = {}

    def cap(self, label: str, value: str) -> str:
        seen = self.admitted.setdefault(label, set())
        if value in seen:
            return value
        if len(seen) < self.max_values:
            seen.add(value)
            return value
        self.overflow[label] = self.overflow.get(label, 0) + 1
        return OVERFLOW_VALUE

    def admit_all(self, label: str, values: Iterable[str]) -> None:
        for v in values:
            self.cap(label, v)

    def distinct(self, label: str) -> int:
        return len(self.admitted.get(label, ()))

    def to_state(self) -> dict[str, Any]:
        return {
            "max_values": self.max_values,
            "admitted": {k: sorted(v) for k, v in self.admitted.items()},
            "overflow": dict(self.overflow),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LabelCapper:
        out = cls(int(state["max_values"]))
        out.admitted = {k: set(v) for k, v in state["admitted"].items()}
        out.overflow = {k: int(v) for k, v in state["overflow"].items()}
        return out


def prometheus_labels(key: SliceKey, labels: Iterable[str] = ("segment", "surface", "variant")) -> dict[str, str]:
    """Label set for exposition: the slice's values, ``all`` for labels it does not split on."""
    values = dict(key)
    return {lbl: values.get(lbl, ALL_VALUE) for lbl in labels}
