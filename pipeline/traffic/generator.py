"""Deterministic, realistic ranking traffic: impressions and graded feedback, with the usual mess.

Used by the parity tests, ``rankwatch simulate`` and ``rankwatch demo``. For a given :class:`TrafficConfig`
(seed included) the output is identical on every run and machine.

The model of one request:

- arrivals are a Poisson process of ``requests_per_second``; segment, surface and variant are drawn
  uniformly; ``items_per_request`` items are shown;
- each item has a true grade in ``{0, 1, 2, 3}`` (probabilities 0.78, 0.14, 0.05, 0.03); the model's score
  is ``q * grade + (1 - q) * N(0, 1.2)`` rounded to 1e-4, where ``q`` is the segment's quality
  (``segment_quality``, default 0.6), lowered by ``regression.drop`` for ``regression.segment`` from
  ``regression.from_offset_s`` on; items are served by score, with an occasional adjacent swap (business
  rules), so positions and scores do not always agree;
- position-biased graded feedback: the user examines position ``p`` with probability ``p ** -0.7`` and
  clicks an examined item with probability ``(0.03, 0.45, 0.65, 0.85)[grade]``; a clicked item of grade
  >= 2 is added to the cart with probability 0.6, one of grade 3 then purchased with probability 0.6;
  events follow each other by exponential delays (mean 15 s) inside the attribution window.

An optional :class:`ExperimentTraffic` (``TrafficConfig.experiment``) turns the traffic into an A/B test:
every request gets a user out of ``users``; the arm is the user's (a stable hash of the user id, by the
expected split) or, with ``unit="request"``, drawn per request; the model quality ``q`` moves by the arm's
effect in the request's segment and by the user's random effect (normal, ``user_effect_sd``; so requests of
one user are correlated), clipped to ``[0, 1]``; ``broken_split`` drops that share of the last arm's
requests (none of their events are sent: a logging loss that the sample-ratio test must catch). Without an
experiment the output is byte-identical to what it was before experiments existed.

The mess: ``duplicate_rate`` re-delivers an event, ``malformed_rate`` adds a bad event (one of
:data:`MALFORMED_KINDS`) next to a real one, ``out_of_order_ms`` delays delivery by up to that much,
``item_form_share`` of requests use item-form impressions, ``rfc3339_share`` of events carry RFC 3339
times (with a ``Z`` or a ``+02:00`` offset), ``orphan_rate`` adds feedback for a request never served and
``late_rate`` adds feedback outside the attribution window (and, when there is time left, feedback
delivered an hour after its request was final). None of the mess changes the true metrics.
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pandas as pd

from rankwatch.pipeline.clock import datetime_to_ms

GRADE_PROBS = (0.78, 0.14, 0.05, 0.03)
CLICK_PROBS = (0.03, 0.45, 0.65, 0.85)
MALFORMED_KINDS = (
    "invalid_json", "invalid_utf8", "not_an_object", "missing_field", "bad_type", "bad_timestamp",
    "naive_timestamp", "non_finite_score", "bad_position", "duplicate_position", "unknown_action", "bad_grade",
)
_ENC = msgspec.json.Encoder()
_ATTRIBUTION_MS = 30 * 60 * 1000


@dataclass(frozen=True)
class Regression:
    """Lower the quality of ``segment`` by ``drop`` from ``from_offset_s`` seconds after the start."""

    segment: str
    from_offset_s: float
    drop: float = 0.4


@dataclass(frozen=True)
class ExperimentTraffic:
    """An A/B experiment in the simulated traffic (see the module docstring)."""

    arms: tuple[str, ...] = ("control", "treatment")
    split: tuple[float, ...] = ()  # expected share of each arm; empty: equal
    effects: tuple[tuple[str, str, float], ...] = ()  # (arm, segment or "*", change of model quality q)
    users: int = 2_000
    user_effect_sd: float = 0.0
    unit: str = "user"  # "user": the arm is the user's; "request": drawn per request
    broken_split: float = 0.0  # share of the last arm's requests lost before logging

    def __post_init__(self) -> None:
        if len(self.arms) < 2 or len(set(self.arms)) != len(self.arms):
            raise ValueError("an experiment needs at least two distinct arms")
        if self.split and (len(self.split) != len(self.arms) or any(x <= 0 for x in self.split)):
            raise ValueError("split needs one positive share per arm")
        if self.users < 1 or self.user_effect_sd < 0 or not 0 <= self.broken_split < 1:
            raise ValueError("users must be >= 1, user_effect_sd >= 0, broken_split in [0, 1)")
        if self.unit not in ("user", "request"):
            raise ValueError("unit must be 'user' or 'request'")
        for arm, _segment, _delta in self.effects:
            if arm not in self.arms:
                raise ValueError(f"effect for unknown arm {arm!r}")

    @property
    def shares(self) -> tuple[float, ...]:
        raw = self.split or (1.0,) * len(self.arms)
        return tuple(x / sum(raw) for x in raw)

    def effect(self, arm: str, segment: str) -> float:
        return sum(d for a, seg, d in self.effects if a == arm and seg in (segment, "*"))


@dataclass(frozen=True)
class TrafficConfig:
    seed: int = 0
    start: datetime = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    requests_per_second: float = 20.0
    duration_s: float = 600.0
    segments: tuple[str, ...] = ("new_user", "returning", "power_user")
    surfaces: tuple[str, ...] = ("home_feed", "search")
    variants: tuple[str, ...] = ("control", "treatment")
    items_per_request: int = 20
    segment_quality: dict[str, float] = field(default_factory=dict)
    regression: Regression | None = None
    duplicate_rate: float = 0.0
    malformed_rate: float = 0.0
    out_of_order_ms: int = 0
    item_form_share: float = 0.0
    rfc3339_share: float = 0.0
    orphan_rate: float = 0.0
    late_rate: float = 0.0
    models: tuple[str, ...] = ("ranker-v12",)
    attribution_window_ms: int = _ATTRIBUTION_MS
    experiment: ExperimentTraffic | None = None

    def __post_init__(self) -> None:
        if self.start.tzinfo is None:
            raise ValueError("start must be timezone-aware")
        if self.requests_per_second <= 0 or self.duration_s < 0 or self.items_per_request < 1:
            raise ValueError("requests_per_second must be > 0, duration_s >= 0, items_per_request >= 1")


@dataclass(frozen=True)
class GeneratedEvent:
    stream: str  # "impressions" or "clicks"
    key: bytes  # request_id (the Kafka key)
    value: bytes
    ts_ms: int  # event time (for malformed events: the time it pretends to have)


@dataclass
class _Request:
    """One served request and its true outcome (the oracle's view)."""

    request_id: str
    ts_ms: int
    segment: str
    surface: str
    variant: str
    model: str
    item_ids: list[str]
    positions: list[int]
    scores: list[float]
    labels: list[int]
    user_id: str | None = None  # set by an experiment (otherwise impressions carry u-{i % 997})
    dropped: bool = False  # lost by a broken split: no events, not in the ground truth


class _Generator:
    def __init__(self, cfg: TrafficConfig) -> None:
        self.cfg = cfg
        # random.Random: scalar draws are ~20x cheaper than numpy's and just as reproducible across machines.
        self.rng = random.Random(cfg.seed)
        self.start_ms = datetime_to_ms(cfg.start)
        self.end_ms = self.start_ms + int(cfg.duration_s * 1000)
        self.seq = 0
        self.heap: list[tuple[int, int, GeneratedEvent]] = []
        exp = cfg.experiment
        if exp is not None:
            # A separate stream for the users' effects and arms: they are fixed properties of the users.
            urng = random.Random(f"{cfg.seed}-users")
            self.user_effects = [urng.gauss(0.0, exp.user_effect_sd) for _ in range(exp.users)]
            self.user_arms = [_arm_by_share(exp, (zlib.crc32(f"u-{u}".encode()) + 0.5) / 2**32)
                              for u in range(exp.users)]  # fmt: skip

    # -- timestamps and delivery -------------------------------------------------------------------------
    def _ts(self, ms: int) -> int | str:
        if self.rng.random() >= self.cfg.rfc3339_share:
            return ms
        when = datetime.fromtimestamp(ms / 1000, tz=UTC)
        if self.rng.random() < 0.5:
            return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        return when.astimezone(_PLUS2).isoformat(timespec="milliseconds")

    def _deliver(self, stream: str, rid: str, doc: dict[str, Any] | bytes, ts_ms: int, *, delay_ms: int = 0) -> None:
        cfg, rng = self.cfg, self.rng
        value = doc if isinstance(doc, bytes) else _ENC.encode(doc)
        event = GeneratedEvent(stream, rid.encode(), value, ts_ms)
        jitter = rng.randint(0, cfg.out_of_order_ms) if cfg.out_of_order_ms else 0
        self._push(ts_ms + delay_ms + jitter, event)
        if cfg.duplicate_rate and rng.random() < cfg.duplicate_rate:
            again = rng.randint(jitter, cfg.out_of_order_ms) if cfg.out_of_order_ms else 0
            self._push(ts_ms + delay_ms + again, event)  # the copy comes later, still within the disorder
        if cfg.malformed_rate and rng.random() < cfg.malformed_rate:
            bad = _malformed(MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))], stream, self.seq, ts_ms)
            self._push(ts_ms + delay_ms + jitter, GeneratedEvent(stream, f"bad-{self.seq}".encode(), bad, ts_ms))

    def _push(self, arrival: int, event: GeneratedEvent) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (arrival, self.seq, event))

    def _drain(self, before: int | None) -> Iterator[GeneratedEvent]:
        while self.heap and (before is None or self.heap[0][0] < before):
            yield heapq.heappop(self.heap)[2]

    # -- one request -------------------------------------------------------------------------------------
    def request(self, i: int, ts_ms: int) -> tuple[_Request, list[int]]:
        """A served request and the true grades of its items in served order."""
        cfg, rng = self.cfg, self.rng
        segment = cfg.segments[rng.randrange(len(cfg.segments))]
        surface = cfg.surfaces[rng.randrange(len(cfg.surfaces))]
        variant = cfg.variants[rng.randrange(len(cfg.variants))]
        model = cfg.models[rng.randrange(len(cfg.models))]
        q = cfg.segment_quality.get(segment, 0.6)
        reg = cfg.regression
        if reg is not None and reg.segment == segment and ts_ms - self.start_ms >= reg.from_offset_s * 1000:
            q = max(q - reg.drop, 0.0)
        user_id = None
        exp = cfg.experiment
        if exp is not None:
            u = rng.randrange(exp.users)
            user_id = f"u-{u}"
            variant = self.user_arms[u] if exp.unit == "user" else _arm_by_share(exp, rng.random())
            q = min(max(q + exp.effect(variant, segment) + self.user_effects[u], 0.0), 1.0)
        n = cfg.items_per_request
        grades = rng.choices(range(4), weights=GRADE_PROBS, k=n)
        scores = [round(q * g + (1 - q) * rng.gauss(0.0, 1.2), 4) for g in grades]
        order = sorted(range(n), key=lambda j: -scores[j])
        for k in range(n - 1):  # business rules: a few adjacent swaps
            if rng.random() < 0.05:
                order[k], order[k + 1] = order[k + 1], order[k]
        pool = rng.sample(range(1_000_000), n)
        served = order
        req = _Request(
            f"r-{cfg.seed}-{i}", ts_ms, segment, surface, variant, model,
            [f"i-{pool[j]}" for j in served], list(range(1, n + 1)), [float(scores[j]) for j in served], [0] * n,
            user_id or f"u-{i % 997}",  # every request has a user, the GAUC group
        )
        return req, [int(grades[j]) for j in served]

    def emit(self, i: int, ts_ms: int) -> _Request:
        """Generate request ``i`` and deliver its events; returns the request with its true labels."""
        cfg, rng = self.cfg, self.rng
        req, true_grades = self.request(i, ts_ms)
        exp = cfg.experiment
        if exp is not None and exp.broken_split and req.variant == exp.arms[-1] and rng.random() < exp.broken_split:
            req.dropped = True
            return req
        self._impressions(i, req)
        self._feedback(i, req, true_grades)
        if cfg.orphan_rate and rng.random() < cfg.orphan_rate:
            rid = f"orphan-{cfg.seed}-{i}"
            fts = ts_ms + rng.randint(1, 60_000)
            self._deliver("clicks", rid, {"event_id": f"clk-o-{cfg.seed}-{i}", "request_id": rid, "item_id": "i-1",
                                          "ts": self._ts(fts), "action": "click"}, fts)
        return req

    def _impressions(self, i: int, req: _Request) -> None:
        cfg, rng = self.cfg, self.rng
        # user_id first: list-form events keep their bytes; item-form events carry the user too
        labels: dict[str, Any] = {"user_id": req.user_id, "segment": req.segment, "surface": req.surface,
                                  "variant": req.variant}
        if rng.random() < 0.9:
            labels["model"] = req.model
        else:
            req.model = "unknown"
        items = [{"item_id": it, "position": p, "score": s}
                 for it, p, s in zip(req.item_ids, req.positions, req.scores, strict=True)]
        if rng.random() < cfg.item_form_share:
            for k, item in enumerate(items):
                ts = req.ts_ms + k  # item events of one request a few ms apart; request_ts is the first
                self._deliver("impressions", req.request_id, {"event_id": f"imp-{cfg.seed}-{i}-{k}",
                              "request_id": req.request_id, "ts": self._ts(ts), **labels, **item}, ts)
        else:
            if rng.random() < 0.2:
                rng.shuffle(items)  # producers do not always send items in position order
            self._deliver("impressions", req.request_id, {"event_id": f"imp-{cfg.seed}-{i}",
                          "request_id": req.request_id, "ts": self._ts(req.ts_ms),
                          **labels, "items": items}, req.ts_ms)

    def _feedback(self, i: int, req: _Request, true_grades: list[int]) -> None:
        cfg, rng = self.cfg, self.rng
        attr = cfg.attribution_window_ms
        served_grade = {it: 0 for it in req.item_ids}
        k = 0
        for pos, item, g in zip(req.positions, req.item_ids, true_grades, strict=True):
            if rng.random() >= pos ** -0.7 or rng.random() >= CLICK_PROBS[g]:
                continue
            actions = ["click"]
            if g >= 2 and rng.random() < 0.6:
                actions.append("add_to_cart")
                if g == 3 and rng.random() < 0.6:
                    actions.append("purchase")
            fts = req.ts_ms
            for action in actions:
                fts += int(rng.expovariate(1 / 15_000)) + 1
                if fts > req.ts_ms + attr:
                    break
                doc: dict[str, Any] = {"event_id": f"clk-{cfg.seed}-{i}-{k}", "request_id": req.request_id,
                                       "item_id": item, "ts": self._ts(fts), "action": action}
                if rng.random() < 0.05:
                    doc["grade"] = {"click": 1, "add_to_cart": 2, "purchase": 3}[action]
                k += 1
                self._deliver("clicks", req.request_id, doc, fts)
                served_grade[item] = max(served_grade[item], {"click": 1, "add_to_cart": 2, "purchase": 3}[action])
        if cfg.late_rate and rng.random() < cfg.late_rate:
            item = req.item_ids[rng.randrange(len(req.item_ids))]
            fts = req.ts_ms + attr + rng.randint(1_000, 600_000)  # outside the attribution window
            self._deliver("clicks", req.request_id, {"event_id": f"clk-{cfg.seed}-{i}-late", "request_id": req.request_id,
                          "item_id": item, "ts": self._ts(fts), "action": "purchase"}, fts)
        if cfg.late_rate and rng.random() < cfg.late_rate and req.ts_ms + attr + 2 * 3_600_000 < self.end_ms:
            item = req.item_ids[0]
            fts = req.ts_ms + 1_000  # inside the window, but delivered an hour after the request was final
            self._deliver("clicks", req.request_id, {"event_id": f"clk-{cfg.seed}-{i}-slow", "request_id": req.request_id,
                          "item_id": item, "ts": self._ts(fts), "action": "purchase"}, fts,
                          delay_ms=attr + 3_600_000)
        req.labels = [served_grade[it] for it in req.item_ids]

    def requests(self) -> Iterator[tuple[int, int]]:
        """(index, request_ts) of every request, Poisson arrivals."""
        t = float(self.start_ms)
        i = 0
        while True:
            t += self.rng.expovariate(self.cfg.requests_per_second / 1000.0)
            if t >= self.end_ms:
                return
            yield i, int(t)
            i += 1


_PLUS2 = timezone(timedelta(hours=2))


def _malformed(kind: str, stream: str, seq: int, ts_ms: int) -> bytes:
    """A bad event of the given kind (see :data:`MALFORMED_KINDS`); every one must be rejected."""
    rid = f"bad-{seq}"
    if stream == "impressions":
        base: dict[str, Any] = {"event_id": f"bad-imp-{seq}", "request_id": rid, "ts": ts_ms, "segment": "new_user",
                                "items": [{"item_id": "i-1", "position": 1, "score": 0.5},
                                          {"item_id": "i-2", "position": 2, "score": 0.4}]}
    else:
        base = {"event_id": f"bad-clk-{seq}", "request_id": rid, "item_id": "i-1", "ts": ts_ms, "action": "click"}
    good = _ENC.encode(base)
    if kind == "invalid_json":
        return good[: len(good) // 2]
    if kind == "invalid_utf8":
        return good.replace(b'"ts"', b'"note":"\xff\xfe","ts"')
    if kind == "not_an_object":
        return b"[" + good + b"]"
    if kind == "missing_field":
        del base["request_id"]
    elif kind == "bad_type":
        base["request_id"] = True  # an integer id is valid (SPEC section 1): a bool is not
    elif kind == "bad_timestamp":
        base["ts"] = "yesterday"
    elif kind == "naive_timestamp":
        base["ts"] = "2026-11-30T10:00:00"
    elif kind == "non_finite_score":
        return good.replace(b'"score":0.5', b'"score":1e999') if stream == "impressions" else good.replace(b'"ts"', b'"grade":1e999,"ts"')
    elif kind == "bad_position" and stream == "impressions":
        base["items"][0]["position"] = 0
    elif kind == "duplicate_position" and stream == "impressions":
        base["items"][1]["position"] = 1
    elif kind == "unknown_action" and stream == "clicks":
        base["action"] = "stare"
    elif kind == "bad_grade" and stream == "clicks":
        base["grade"] = -1
    else:
        base["event_id"] = ""  # kinds that only apply to the other stream: an empty id
    return _ENC.encode(base)


def generate_events(cfg: TrafficConfig) -> Iterator[GeneratedEvent]:
    """All events of the traffic, in delivery order (lazily; memory stays bounded for long runs)."""
    yield from _run(cfg, None)


def _run(cfg: TrafficConfig, truth: list[_Request] | None) -> Iterator[GeneratedEvent]:
    gen = _Generator(cfg)
    horizon = 0
    for i, ts in gen.requests():
        req = gen.emit(i, ts)
        if truth is not None:
            truth.append(req)
        if ts >= horizon:  # nothing generated later can be delivered before its own ts
            yield from gen._drain(ts)
            horizon = ts + 1_000
    yield from gen._drain(None)


def _rows(requests: list[_Request]) -> pd.DataFrame:
    cols: dict[str, list[Any]] = {c: [] for c in ROW_COLUMNS}
    for r in requests:
        if r.dropped:
            continue
        n = len(r.item_ids)
        cols["request_id"] += [r.request_id] * n
        cols["item_id"] += r.item_ids
        cols["position"] += r.positions
        cols["score"] += r.scores
        cols["label"] += r.labels
        for c in ("segment", "surface", "variant", "model", "user_id"):
            cols[c] += [getattr(r, c)] * n
        cols["request_ts"] += [r.ts_ms] * n
    frame = pd.DataFrame(cols)
    frame["request_ts"] = pd.to_datetime(frame["request_ts"], unit="ms", utc=True)
    return frame


ROW_COLUMNS = ("request_id", "item_id", "position", "score", "label", "segment", "surface", "variant", "model",
               "user_id", "request_ts")  # user_id: the GAUC group


def ground_truth_rows(cfg: TrafficConfig) -> pd.DataFrame:
    """The joined rows every valid request should produce: one row per shown item, true attributed label.

    Columns: ``request_id, item_id, position, score, label, segment, surface, variant, model, user_id,
    request_ts``
    (``request_ts`` aware UTC). Regenerates the traffic of ``cfg`` (deterministic), so it equals what the
    streaming core must compute from :func:`generate_events` of the same config.
    """
    truth: list[_Request] = []
    for _ in _run(cfg, truth):
        pass
    return _rows(truth)


def generate_with_truth(cfg: TrafficConfig) -> tuple[list[GeneratedEvent], pd.DataFrame]:
    """Events and ground-truth rows in one generation pass (for tests)."""
    truth: list[_Request] = []
    events = list(_run(cfg, truth))
    return events, _rows(truth)


def evaluation_frame(cfg: TrafficConfig, n_requests: int) -> pd.DataFrame:
    """An offline evaluation set of ``n_requests`` requests with the ground-truth columns (clean traffic)."""
    clean = replace(cfg, duplicate_rate=0.0, malformed_rate=0.0, orphan_rate=0.0, late_rate=0.0,
                    out_of_order_ms=0, item_form_share=0.0,
                    duration_s=max(cfg.duration_s, 100.0 * n_requests / cfg.requests_per_second + 10.0))
    gen = _Generator(clean)
    out = []
    for i, ts in gen.requests():
        if i >= n_requests:
            break
        out.append(gen.emit(i, ts))
        gen.heap.clear()
    return _rows(out)


def _arm_by_share(exp: ExperimentTraffic, u: float) -> str:
    """The arm whose cumulative share interval holds ``u`` in ``[0, 1)``."""
    acc = 0.0
    for arm, share in zip(exp.arms, exp.shares, strict=True):
        acc += share
        if u < acc:
            return arm
    return exp.arms[-1]
