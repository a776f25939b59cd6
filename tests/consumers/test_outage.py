"""The outage handler (consumers/outage.py) and the dead-letter sink's resend, without a broker."""

from __future__ import annotations

import logging
import random
import re
from typing import Any

import pytest
from kafka import errors as kerr
from prometheus_client import generate_latest

from rankwatch.consumers.deadletters import KafkaDeadLetterSink
from rankwatch.consumers.outage import FatalKafkaError, KafkaOutage, is_fatal, is_retriable
from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.state import MetricsState
from rankwatch.pipeline.events.deadletter import DeadLetter
from rankwatch.pipeline.stream.processor import StreamConfig


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _raise(exc: BaseException) -> Any:
    raise exc


def test_one_log_line_per_outage_and_outage_seconds(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    out = KafkaOutage(clock=clock, rng=random.Random(1))
    caplog.set_level(logging.INFO, logger="rankwatch.consumers.outage")
    for _ in range(20):  # twenty failed retries: one outage, one line
        ok, value = out.attempt("poll", _raise, kerr.KafkaConnectionError("111 ECONNREFUSED"))
        assert (ok, value) == (False, None)
        clock.t += 0.5
    assert out.active and out.outages == 1
    assert out.seconds_total() == pytest.approx(10.0)
    assert out.attempt("commit", lambda: 42) == (True, 42)  # a step that succeeds ends nothing by itself
    out.succeeded()
    clock.t += 100
    assert not out.active and out.seconds_total() == pytest.approx(10.0)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("Kafka unreachable" in m for m in lines) == 1
    assert sum("reachable again after 10.0 s" in m for m in lines) == 1
    out.attempt("checkpoint write", _raise, kerr.KafkaTimeoutError("flush"))
    assert out.outages == 2


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    out = KafkaOutage(backoff_initial_s=0.2, backoff_max_s=5.0, clock=FakeClock(), rng=random.Random(3))
    assert out.backoff() == 0.0
    for n in range(1, 15):
        out.failed("poll", TimeoutError())
        base = min(5.0, 0.2 * 2 ** (n - 1))
        delays = [out.backoff() for _ in range(50)]
        assert all(base * 0.5 <= d <= base for d in delays)
        assert max(delays) > min(delays)  # jittered
    out.succeeded()
    assert out.backoff() == 0.0


@pytest.mark.parametrize("exc", [
    kerr.TopicAuthorizationFailedError(), kerr.GroupAuthorizationFailedError(), kerr.UnsupportedCodecError("lz4"),
    kerr.SaslAuthenticationFailedError(), FatalKafkaError("topic gone"),
])
def test_fatal_errors_end_with_one_line(exc: BaseException) -> None:
    assert is_fatal(exc) and not is_retriable(exc)
    with pytest.raises(FatalKafkaError) as info:
        KafkaOutage().attempt("poll", _raise, exc)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("exc", [kerr.KafkaConnectionError("refused"), kerr.KafkaTimeoutError(), kerr.NodeNotReadyError(),
                                 kerr.CoordinatorNotAvailableError(), ConnectionRefusedError(), TimeoutError()])
def test_retriable_errors(exc: BaseException) -> None:
    assert is_retriable(exc) and not is_fatal(exc)


def test_group_events_and_bugs_propagate() -> None:
    with pytest.raises(kerr.CommitFailedError):
        KafkaOutage().attempt("commit", _raise, kerr.CommitFailedError())
    with pytest.raises(ZeroDivisionError):
        KafkaOutage().attempt("poll", lambda: 1 / 0)


class FakeFuture:
    def __init__(self, error: BaseException | None) -> None:
        self.error = error

    def add_errback(self, fn: Any) -> None:
        if self.error is not None:
            fn(self.error)


class FakeProducer:
    def __init__(self) -> None:
        self.mode = "down"
        self.sent: list[bytes] = []

    def send(self, topic: str, **kw: Any) -> FakeFuture:
        if self.mode == "block":
            raise kerr.KafkaTimeoutError("metadata not available after 2000 ms")
        if self.mode == "down":
            return FakeFuture(kerr.KafkaTimeoutError("delivery timed out"))
        if self.mode == "too-large":
            return FakeFuture(kerr.MessageSizeTooLargeError())
        self.sent.append(kw["value"])
        return FakeFuture(None)


def _letter(i: int) -> DeadLetter:
    return DeadLetter(stream="impressions", raw=b"bad%d" % i, reason="bad_json", detail="x", source=None)  # type: ignore[arg-type]


def test_dead_letters_failing_in_an_outage_are_kept_and_resent_once() -> None:
    producer = FakeProducer()
    sink = KafkaDeadLetterSink(producer, "dl", max_unsent=3)
    for i in range(2):
        sink.send(_letter(i))  # delivery fails asynchronously
    producer.mode = "block"
    sink.send(_letter(2))  # send() itself raises: the core never sees it
    assert [d.raw for d in sink.unsent] == [b"bad0", b"bad1", b"bad2"] and sink.failures == 0
    sink.send(_letter(3))  # beyond max_unsent: the oldest is dropped and counted
    assert len(sink.unsent) == 3 and sink.failures == 1
    producer.mode = "up"
    assert sink.resend() == 3
    assert producer.sent == [b"bad1", b"bad2", b"bad3"] and not sink.unsent
    producer.mode = "too-large"
    sink.send(_letter(4))  # refused for good: counted, not retried forever
    assert not sink.unsent and sink.failures == 2
    assert sum(sink.counts.values()) == 5


def test_outage_figures_are_exported() -> None:
    state = MetricsState.for_stream(StreamConfig(windows=("1m",)))
    state.set_kafka_outage(True, 12.5)
    text = generate_latest(build_registry(state)).decode()
    assert "rankwatch_kafka_outage 1.0" in text
    assert "rankwatch_kafka_outage_seconds_total 12.5" in text
    state.set_kafka_outage(False, 20.0)
    text = generate_latest(build_registry(state)).decode()
    assert "rankwatch_kafka_outage 0.0" in text and "rankwatch_kafka_outage_seconds_total 20.0" in text


class TopicsConsumer:
    """A consumer whose metadata cache (``_cluster``) knows ``counts`` partitions per topic."""

    def __init__(self, counts: dict[str, int | None]) -> None:
        self.counts = counts
        self._cluster = self

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return None if n is None else set(range(n))


def _service(counts: dict[str, int | None]) -> Any:
    from rankwatch.consumers.service import ConsumerService
    from rankwatch.consumers.settings import KafkaSettings

    svc = ConsumerService(KafkaSettings(impressions_topic="imp", clicks_topic="clk"), StreamConfig(windows=("1m",)),
                          on_window=lambda w: None, clock=None)  # type: ignore[arg-type]
    svc._consumer = TopicsConsumer(counts)  # type: ignore[assignment]
    return svc


@pytest.mark.parametrize(("counts", "message"), [
    ({"imp": 4, "clk": None}, "topic clk does not exist any more"),
    ({"imp": 4, "clk": 8}, "no longer co-partitioned (4 and 8 partitions)"),
])
def test_a_topic_gone_or_a_co_partitioning_break_is_fatal_after_60_s(counts: dict[str, int | None], message: str) -> None:
    svc = _service(counts)
    svc._check_topics(0.0)
    svc._check_topics(59.0)  # a moment (an admin adding partitions to both topics one after the other)
    with pytest.raises(FatalKafkaError, match=re.escape(message)):
        svc._check_topics(60.0)
    svc = _service(counts)
    svc._outage.failed("poll", TimeoutError())  # an unreachable cluster's metadata says nothing
    svc._check_topics(0.0)
    svc._check_topics(100.0)
    svc = _service({"imp": 4, "clk": 4})
    for t in (0.0, 60.0, 120.0):
        svc._check_topics(t)


def test_readyz_is_not_ready_during_an_outage() -> None:
    from rankwatch.consumers.stats import ServiceHealth

    svc = _service({"imp": 1, "clk": 1})
    svc._health = ServiceHealth(running=True, assigned=(0,))
    assert svc.ready()
    svc._outage.failed("poll", TimeoutError())
    assert not svc.ready()
    svc._outage.succeeded()
    assert svc.ready()


def test_known_position_reads_the_subscription_without_io() -> None:
    from types import SimpleNamespace

    from kafka.structs import OffsetAndMetadata

    from rankwatch.consumers.fetch_compat import known_position

    class NoIO:
        _subscription = SimpleNamespace(assignment={
            "a": SimpleNamespace(position=OffsetAndMetadata(42, "", -1)), "b": SimpleNamespace(position=None)})

        def position(self, *_: Any, **__: Any) -> int:
            raise AssertionError("position() does network I/O without a time limit")

    assert known_position(NoIO(), "a") == 42
    assert known_position(NoIO(), "b") is None
    assert known_position(NoIO(), "c") is None  # not assigned
