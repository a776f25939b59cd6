"""One A/B experiment's definition (``[[experiments]]`` in the TOML, or ``rankwatch ab``'s options).

:func:`experiment_from_dict` checks a plain mapping (what TOML gives, or what the command line builds) and
raises ``ValueError`` naming the key. Defaults: the arm is carried by the ``variant`` label,
the control arm is ``control``, the split is equal, the unit is the request, alpha is 0.05, and a
comparison needs 1,000 requests per arm and slice (AUCs also 100 positives and 100 negatives per arm).

The always-valid interval's tuning ``n_star`` (the number of units, both arms together, where the mixture
boundary is tightest) defaults to 50,000 for requests and 5,000 for users: about a day of one segment x
surface cell at 1 request per second, and the users behind it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Literal

__all__ = ["ARM_LABELS", "DEFAULT_N_STAR", "ExperimentSpec", "experiment_from_dict"]

Unit = Literal["request", "user"]
Decision = Literal["sequential", "fixed"]
ARM_LABELS = ("variant", "model")
DEFAULT_N_STAR: dict[str, int] = {"request": 50_000, "user": 5_000}
_KEYS = frozenset({"name", "label", "control", "treatments", "split", "start", "unit", "alpha", "min_requests",
                   "min_positives", "min_negatives", "n_star", "decision", "max_users", "user_buckets"})


@dataclass(frozen=True)
class ExperimentSpec:
    """An experiment: which label holds the arm, which arms, expected split, unit, decision rule."""

    name: str
    label: str = "variant"
    control: str = "control"
    treatments: tuple[str, ...] = ("treatment",)
    split: Mapping[str, float] = field(default_factory=dict)  # arm -> share; empty: equal
    start: datetime | None = None  # requests before it are not part of the experiment
    unit: Unit = "request"
    alpha: float = 0.05
    min_requests: int = 1_000
    min_positives: int = 100
    min_negatives: int = 100
    n_star: int = 0  # 0: DEFAULT_N_STAR of the unit
    decision: Decision = "sequential"
    max_users: int = 1_000_000  # per-user state cap; beyond it users share hashed buckets (counted)
    user_buckets: int = 1_024

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must be a non-empty string")
        if self.label not in ARM_LABELS:
            raise ValueError(f"label: must be one of {', '.join(ARM_LABELS)}, got {self.label!r}")
        if not self.treatments:
            raise ValueError("treatments: at least one treatment arm is needed")
        if self.control in self.treatments or len(set(self.treatments)) != len(self.treatments):
            raise ValueError("treatments: arms must be distinct and differ from the control")
        if self.split:
            if set(self.split) != set(self.arms):
                raise ValueError(f"split: needs a share for each arm ({', '.join(self.arms)})")
            if any(not v > 0 for v in self.split.values()):
                raise ValueError("split: shares must be > 0")
        if self.unit not in ("request", "user"):
            raise ValueError(f"unit: must be 'request' or 'user', got {self.unit!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha: must be between 0 and 1, got {self.alpha}")
        if self.decision not in ("sequential", "fixed"):
            raise ValueError(f"decision: must be 'sequential' or 'fixed', got {self.decision!r}")
        for key in ("min_requests", "max_users", "user_buckets"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be >= 1")
        for key in ("min_positives", "min_negatives", "n_star"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key}: must be >= 0")
        if self.start is not None and self.start.tzinfo is None:
            raise ValueError("start: needs a time zone")

    @property
    def arms(self) -> tuple[str, ...]:
        return (self.control, *self.treatments)

    @property
    def shares(self) -> dict[str, float]:
        """Expected share of each arm (normalised to sum 1)."""
        raw = dict(self.split) if self.split else dict.fromkeys(self.arms, 1.0)
        total = sum(raw.values())
        return {a: raw[a] / total for a in self.arms}

    @property
    def tuning(self) -> int:
        """``N*`` of the always-valid interval, in units of the experiment."""
        return self.n_star or DEFAULT_N_STAR[self.unit]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "label": self.label, "control": self.control, "treatments": list(self.treatments),
            "split": self.shares, "start": None if self.start is None else _rfc3339(self.start),
            "unit": self.unit, "alpha": self.alpha, "min_requests": self.min_requests,
            "min_positives": self.min_positives, "min_negatives": self.min_negatives, "n_star": self.tuning,
            "decision": self.decision,
        }  # fmt: skip


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_start(value: Any) -> datetime:
    """An RFC 3339 string (or a TOML datetime) with a zone."""
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, date):
        raise ValueError(f"start: needs a time and a zone, got {value!r}")
    elif isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"start: not an RFC 3339 time: {value!r}") from None
    else:
        raise ValueError(f"start: expected an RFC 3339 time, got {type(value).__name__}")
    if when.tzinfo is None:
        raise ValueError(f"start: needs a time zone (e.g. Z), got {value!r}")
    return when


def experiment_from_dict(data: Mapping[str, Any]) -> ExperimentSpec:
    """Check a mapping of the ``[[experiments]]`` keys; ``ValueError`` naming the key on any problem."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown key (known: {', '.join(sorted(_KEYS))})")

    def typed(key: str, kind: type | tuple[type, ...], default: Any) -> Any:
        if key not in data:
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            if not (kind is float and isinstance(value, int) and not isinstance(value, bool)):
                raise ValueError(f"{key}: expected {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    if "name" not in data:
        raise ValueError("name: missing")
    treatments = typed("treatments", (list, tuple), ["treatment"])
    if isinstance(treatments, str) or not all(isinstance(t, str) and t for t in treatments):
        raise ValueError("treatments: expected a list of non-empty strings")
    split = typed("split", dict, {})
    for arm, share in split.items():
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise ValueError(f"split.{arm}: expected a number, got {share!r}")
    return ExperimentSpec(
        name=typed("name", str, ""),
        label=typed("label", str, "variant"),
        control=typed("control", str, "control"),
        treatments=tuple(treatments),
        split={str(k): float(v) for k, v in split.items()},
        start=parse_start(data["start"]) if data.get("start") not in (None, "") else None,
        unit=typed("unit", str, "request"),
        alpha=float(typed("alpha", float, 0.05)),
        min_requests=typed("min_requests", int, 1_000),
        min_positives=typed("min_positives", int, 100),
        min_negatives=typed("min_negatives", int, 100),
        n_star=typed("n_star", int, 0),
        decision=typed("decision", str, "sequential"),
        max_users=typed("max_users", int, 1_000_000),
        user_buckets=typed("user_buckets", int, 1_024),
    )
