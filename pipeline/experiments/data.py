"""Per-arm, per-slice sufficient statistics of an experiment, from evaluation rows or logged events.

:func:`experiment_cells` turns an :class:`pipeline.offline.readers.EvaluationSet` into one :class:`ArmCell` per
(arm, slice): the request-level :class:`pipeline.metrics.aggregates.RankingAggregate` of the kernel (counts, metric
sums and sums of squares, AUC histogram) and, per metric, the per-user sums the delta method needs when the
user is the unit of randomisation (:class:`UnitSums`). The all-segments slice ``()`` of an arm is computed
from the arm's requests directly (a user's requests in different segments are summed before squaring).

Per-user state is bounded: the first ``max_users`` users (by first appearance) are kept one by one, later
users share ``user_buckets`` buckets chosen by CRC-32 of the user id. A bucket is a union of whole users,
so the clustered variance stays valid (a coarser clustering), only less efficient; folded users are
counted (``users_folded``).

:func:`rows_from_logs` is the batch join of logged events for ``rankwatch ab --impressions/--clicks``: the
logs are complete, so every event is decided with hindsight (no watermark, nothing late but feedback
outside ``[request_ts, request_ts + attribution window]``); validation, dedupe by ``event_id`` and grades
are the streaming core's.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt
import pandas as pd

from rankwatch.pipeline.events.records import Feedback, Impression
from rankwatch.pipeline.events.validation import (
    DEFAULT_ACTION_GRADES,
    Rejection,
    feedback_or_rejection,
    impression_or_rejection,
)
from rankwatch.pipeline.experiments.spec import ExperimentSpec
from rankwatch.pipeline.metrics.aggregates import RankingAggregate, aggregate_groups
from rankwatch.pipeline.metrics.kernel import PerRequestMetrics, offsets_from_lengths, per_request_metrics
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import rank_order, slice_groups
from rankwatch.pipeline.offline.grouping import first_rows
from rankwatch.pipeline.offline.readers import EvaluationSet
from rankwatch.pipeline.slicing import SliceKey, SliceSpec

__all__ = ["ArmCell", "ExperimentData", "UnitSums", "experiment_cells", "rows_from_logs"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class UnitSums:
    """Over the units (users) of one arm and slice: ``n`` units with ``N_u > 0`` and the sums of
    ``Y_u``, ``N_u``, ``Y_u^2``, ``N_u^2`` and ``Y_u N_u`` (``Y_u`` the user's metric sum, ``N_u`` its count)."""

    n: int
    sum_y: float
    sum_n: float
    sum_yy: float
    sum_nn: float
    sum_yn: float


@dataclass
class ArmCell:
    """One arm of one slice."""

    aggregate: RankingAggregate
    units: dict[str, UnitSums] = field(default_factory=dict)  # metric -> per-user sums (unit = user)
    users: int = 0


@dataclass
class ExperimentData:
    """Cells keyed by ``(arm, slice key)`` (``()`` the all-segments slice) and the experiment's counts."""

    spec: ExperimentSpec
    options: MetricOptions
    slice_spec: SliceSpec
    cells: dict[tuple[str, SliceKey], ArmCell]
    requests: dict[str, int]  # per arm, after the start time
    users: dict[str, int]  # distinct users per arm (0 without user ids)
    other_arm_requests: int = 0  # requests whose arm label is not one of the experiment's arms
    before_start_requests: int = 0
    users_folded: int = 0  # users past max_users, sharing hashed buckets
    crossover_users: int = 0  # users seen in more than one arm

    def slice_keys(self) -> list[SliceKey]:
        """The all-segments slice first, then every slice in sorted order."""
        keys = sorted({k for _arm, k in self.cells if k})
        return [(), *keys]


def experiment_cells(
    evalset: EvaluationSet,
    spec: ExperimentSpec,
    *,
    options: MetricOptions | None = None,
    slice_spec: SliceSpec | None = None,
    users: npt.NDArray[np.object_] | None = None,
    request_ts_ms: IntArray | None = None,
) -> ExperimentData:
    """Cells of an experiment from validated rows.

    ``users[j]`` / ``request_ts_ms[j]`` are the user id and request time of request code ``j`` (None: not
    known). Requests before ``spec.start`` (when times are known) and requests of other arms are left out
    and counted. ``spec.unit == "user"`` needs ``users``.
    """
    options = options or MetricOptions()
    slice_spec = slice_spec or SliceSpec()
    if spec.label in slice_spec.by:
        raise ValueError(f"the arm label {spec.label!r} cannot also be a slice label")
    if spec.unit == "user" and users is None:
        raise ValueError("unit = 'user' needs a user_id for every request (a user_id column or field)")
    n = evalset.n_requests
    ranked = rank_order(evalset.request_codes, position=evalset.positions, scores=evalset.scores)
    lengths = np.bincount(evalset.request_codes, minlength=n)
    labels, scores = evalset.relevance[ranked], evalset.scores[ranked]
    metrics = per_request_metrics(labels, offsets_from_lengths(lengths), options)

    found = evalset.labels.get(spec.label)
    arm_of_value = {a: i for i, a in enumerate(spec.arms)}
    arm = np.full(n, -1, dtype=np.int64)
    if found is not None:
        lookup = np.array([arm_of_value.get(v, -1) for v in found.values], dtype=np.int64)
        arm = lookup[found.codes]
    in_arms = arm >= 0
    before = np.zeros(n, dtype=bool)
    if spec.start is not None and request_ts_ms is not None:
        before = request_ts_ms < int(spec.start.timestamp() * 1000)
    keep = in_arms & ~before
    if slice_spec.by:
        sgroup, skeys, _overflow = slice_groups(evalset, slice_spec)
    else:
        sgroup, skeys = np.zeros(n, dtype=np.int64), []
    n_arms, n_slices = len(spec.arms), max(len(skeys), 1)
    trash = n_arms * (n_slices + 1)
    # group ids: arm * (n_slices + 1) + slice (the last one per arm is the all-segments slice)
    cell_group = np.where(keep, arm * (n_slices + 1) + sgroup, trash)
    arm_group = np.where(keep, arm * (n_slices + 1) + n_slices, trash)
    aggs = aggregate_groups(metrics, labels, scores, cell_group, trash + 1, options)
    arm_aggs = aggregate_groups(metrics, labels, scores, arm_group, trash + 1, options)

    cells: dict[tuple[str, SliceKey], ArmCell] = {}
    for a, name in enumerate(spec.arms):
        base = a * (n_slices + 1)
        cells[(name, ())] = ArmCell(arm_aggs[base + n_slices])
        for s, key in enumerate(skeys):
            if aggs[base + s].requests:
                cells[(name, key)] = ArmCell(aggs[base + s])

    data = ExperimentData(
        spec=spec, options=options, slice_spec=slice_spec, cells=cells,
        requests={name: int(np.count_nonzero(keep & (arm == a))) for a, name in enumerate(spec.arms)},
        users=dict.fromkeys(spec.arms, 0),
        other_arm_requests=int(np.count_nonzero(~in_arms)),
        before_start_requests=int(np.count_nonzero(in_arms & before)),
    )  # fmt: skip
    if users is not None:
        _add_user_sums(data, metrics, users, keep, arm, sgroup, skeys, n_slices)
    return data


def _add_user_sums(
    data: ExperimentData, metrics: PerRequestMetrics, users: npt.NDArray[np.object_], keep: npt.NDArray[np.bool_],
    arm: IntArray, sgroup: IntArray, skeys: list[SliceKey], n_slices: int,
) -> None:  # fmt: skip
    spec = data.spec
    codes, uniques = pd.factorize(pd.Series(users[keep], dtype=object), use_na_sentinel=False)
    codes = codes.astype(np.int64)
    if uniques.size > spec.max_users:
        over = codes >= spec.max_users
        hashes = np.array([zlib.crc32(str(u).encode()) % spec.user_buckets for u in uniques[spec.max_users:]],
                          dtype=np.int64)  # fmt: skip
        codes = np.where(over, spec.max_users + hashes[np.maximum(codes - spec.max_users, 0)], codes)
        data.users_folded = int(uniques.size - spec.max_users)
    n_codes = int(codes.max()) + 1 if codes.size else 1
    k_arm, k_slice = arm[keep], sgroup[keep]
    arm_user = np.unique(k_arm * n_codes + codes)
    data.users = {name: int(np.count_nonzero(arm_user // n_codes == a)) for a, name in enumerate(spec.arms)}
    per_user_arms = np.bincount(arm_user % n_codes, minlength=n_codes)
    data.crossover_users = int(np.count_nonzero(per_user_arms > 1))
    has_rel = metrics.n_relevant[keep] > 0
    zero = data.options.no_relevant == "zero"
    groupings: list[tuple[IntArray, list[SliceKey] | None]] = [(k_arm * (n_slices + 1) + n_slices, None)]
    if skeys:
        groupings.append((k_arm * (n_slices + 1) + k_slice, skeys))
    for cell_id, keys in groupings:
        key = cell_id * n_codes + codes
        uniq, inverse = np.unique(key, return_inverse=True)
        cell_of_unit = uniq // n_codes
        cells_present, unit_cell = np.unique(cell_of_unit, return_inverse=True)
        users_per_cell = np.bincount(unit_cell, minlength=cells_present.size)
        targets = [_cell_for(data, int(c), n_slices, keys) for c in cells_present]
        for ci, cell in enumerate(targets):
            if cell is not None:
                cell.users = int(users_per_cell[ci])
        for name, vals in metrics.values.items():
            v = vals[keep]
            defined = np.ones(v.size, dtype=bool) if zero else has_rel
            y = np.bincount(inverse, weights=np.where(defined, np.nan_to_num(v), 0.0), minlength=uniq.size)
            cnt = np.bincount(inverse, weights=defined.astype(np.float64), minlength=uniq.size)
            present = cnt > 0
            sums = [np.bincount(unit_cell, weights=w, minlength=cells_present.size)
                    for w in (present.astype(np.float64), y, cnt, y * y, cnt * cnt, y * cnt)]  # fmt: skip
            for ci, cell in enumerate(targets):
                if cell is not None:
                    cell.units[name] = UnitSums(int(sums[0][ci]), *(float(s[ci]) for s in sums[1:]))


def _cell_for(data: ExperimentData, cell_id: int, n_slices: int, keys: list[SliceKey] | None) -> ArmCell | None:
    a, s = divmod(cell_id, n_slices + 1)
    key: SliceKey = () if keys is None or s == n_slices else keys[s]
    return data.cells.get((data.spec.arms[a], key))


def request_extras(
    evalset: EvaluationSet, extras: pd.DataFrame
) -> tuple[npt.NDArray[np.object_] | None, IntArray | None]:
    """``user_id`` and ``request_ts`` (epoch ms) per request code, from a frame with a ``request_id`` column.

    Either column may be absent (None). A request's first row with the column set wins; a request without
    a user id gets the id ``"request:<request_id>"`` (its own unit).
    """
    if extras.empty or "request_id" not in extras.columns:
        return None, None
    first = first_rows(evalset.request_codes)
    request_ids = evalset.frame["request_id"].iloc[first].astype(str).to_numpy()
    extras = extras.assign(request_id=extras["request_id"].astype(str)).drop_duplicates("request_id")
    indexed = extras.set_index("request_id").reindex(request_ids)
    users = ts = None
    if "user_id" in indexed.columns:
        col = indexed["user_id"]
        users = np.where(col.isna() | (col.astype(str) == ""), "request:" + pd.Series(request_ids),
                         col.astype(str)).astype(object)  # fmt: skip
    if "request_ts" in indexed.columns:
        ts = _epoch_ms(indexed["request_ts"])
    return users, ts


def _epoch_ms(column: pd.Series) -> IntArray:
    """Epoch milliseconds of RFC 3339 strings, datetimes or epoch-ms numbers; unreadable: never before start."""
    if pd.api.types.is_numeric_dtype(column):
        parsed = pd.to_datetime(column, unit="ms", utc=True, errors="coerce")
    else:
        parsed = pd.to_datetime(column, utc=True, errors="coerce", format="mixed")
    missing = parsed.isna().to_numpy()
    ms = parsed.dt.tz_localize(None).to_numpy(dtype="datetime64[ms]").astype(np.int64)
    ms[missing] = np.iinfo(np.int64).max
    return ms


class _WireUser(msgspec.Struct, gc=False):
    user_id: str | None = None


_USER_DECODER = msgspec.json.Decoder(_WireUser)


@dataclass
class LogJoin:
    """Counts of :func:`rows_from_logs` (rejected and duplicate events, attributed and outside feedback)."""

    rejected: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0
    attributed: int = 0
    outside_window: int = 0
    orphans: int = 0

    def accept(self, stream: str, event: Any, seen: set[str]) -> bool:
        """Count a rejection (``event`` is a Rejection) or a repeated ``event_id``; True for a new event."""
        if not isinstance(event, Impression | Feedback):
            self.rejected[f"{stream}/{event.reason}"] = self.rejected.get(f"{stream}/{event.reason}", 0) + 1
            return False
        if event.event_id in seen:
            self.duplicates += 1
            return False
        seen.add(event.event_id)
        return True


def _translated(translator: Any, stream: str, raws: Iterable[bytes], counts: LogJoin) -> Iterable[bytes]:
    """Section 1 events of a team's messages (a rejected message is counted, not passed on)."""
    for raw in raws:
        out = translator.translate(stream, raw)
        if type(out) is Rejection:
            counts.accept(stream, out, set())
            continue
        yield from out


def rows_from_logs(
    impressions: Iterable[bytes],
    clicks: Iterable[bytes],
    *,
    attribution_window_ms: int = 30 * 60_000,
    action_grades: Mapping[str, int] = DEFAULT_ACTION_GRADES,
    max_event_bytes: int = 1_000_000,
    max_items: int = 200,
    translator: Any = None,
) -> tuple[pd.DataFrame, LogJoin]:
    """Evaluation rows (plus ``user_id``, ``request_ts``) of complete logs, and the join's counts.

    ``translator`` (a :class:`~pipeline.events.translate.Translator`, SPEC section 6) reads logs in a team's
    own schema: every message goes through the translate step of ``replay --config`` and ``run`` first, and
    a message it rejects is counted under its reason like a bad section 1 event.
    """
    counts = LogJoin()
    if translator is not None:
        impressions = _translated(translator, "impressions", impressions, counts)
        clicks = _translated(translator, "clicks", clicks, counts)
    seen: set[str] = set()
    requests: dict[str, dict[str, Any]] = {}
    for raw in impressions:
        imp = impression_or_rejection(raw, max_event_bytes, max_items)
        if not counts.accept("impressions", imp, seen):
            continue
        assert isinstance(imp, Impression)
        req = requests.get(imp.request_id)
        if req is None:
            try:
                user = _USER_DECODER.decode(raw).user_id
            except msgspec.DecodeError:
                user = None
            req = requests[imp.request_id] = {"ts": imp.ts_ms, "labels": imp, "items": {}, "user": user,
                                              "positions": set()}
        req["ts"] = min(req["ts"], imp.ts_ms)
        for item, pos, score in zip(imp.item_ids, imp.positions, imp.scores, strict=True):
            if pos not in req["positions"] and item not in req["items"]:  # the first event wins
                req["positions"].add(pos)
                req["items"][item] = [pos, score, 0]
    for raw in clicks:
        fb = feedback_or_rejection(raw, action_grades, max_event_bytes)
        if not counts.accept("clicks", fb, seen):
            continue
        assert isinstance(fb, Feedback)
        req = requests.get(fb.request_id)
        if req is None:
            counts.orphans += 1
        elif not req["ts"] <= fb.ts_ms <= req["ts"] + attribution_window_ms:
            counts.outside_window += 1
        else:
            counts.attributed += 1
            slot = req["items"].get(fb.item_id)
            if slot is not None:
                slot[2] = max(slot[2], fb.grade)
    cols: dict[str, list[Any]] = {c: [] for c in ("request_id", "item_id", "position", "score", "label", "segment",
                                                  "surface", "variant", "model", "user_id", "request_ts")}
    for rid, req in requests.items():
        imp = req["labels"]
        for item, (pos, score, grade) in req["items"].items():
            for c, v in (("request_id", rid), ("item_id", item), ("position", pos), ("score", score),
                         ("label", grade), ("segment", imp.segment), ("surface", imp.surface),
                         ("variant", imp.variant), ("model", imp.model), ("user_id", req["user"]),
                         ("request_ts", req["ts"])):
                cols[c].append(v)
    frame = pd.DataFrame(cols)
    frame["request_ts"] = pd.to_datetime(frame["request_ts"].astype("int64"), unit="ms", utc=True)
    return frame, counts
