"""One handler for every Kafka step of the consume loop: outages are survived, fatal errors end the process.

Every call the loop makes to Kafka (poll, commits, checkpoint reads and writes, position and end-offset
look-ups, the dead-letter producer) goes through :meth:`KafkaOutage.attempt`. An error is one of:

* **fatal** (:func:`is_fatal`): authentication or authorisation refused, a compression codec not
  installed, a second instance with the same static ``instance_id``, and rankwatch's own
  :class:`FatalKafkaError` (a committed checkpoint that cannot be found, a topic gone, a co-partitioning
  break). It is raised again as :class:`FatalKafkaError` with a one-line reason; ``rankwatch run`` exits 1.
* **retriable** (:func:`is_retriable`): connection refused, timeouts, no coordinator, a leader moving...
  The step is skipped and retried on a later loop turn. The first failure starts an outage and logs one
  WARNING line; retries are spaced by :meth:`KafkaOutage.backoff`, a capped exponential backoff with
  jitter, ``d_n = min(d_max, d_0 2^(n-1)) * U(0.5, 1)``; the first success logs one INFO line with the
  outage's length. ``seconds_total`` adds up the outage time (``rankwatch_kafka_outage_seconds_total``).
* anything else is a group event (a commit refused by a rebalance) or a bug; group events are logged by
  the caller and end no outage; bugs propagate.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kafka import errors as kerr

from rankwatch.pipeline.errors import RankwatchError

log = logging.getLogger(__name__)
T = TypeVar("T")

_FATAL_TYPES: tuple[type[BaseException], ...] = tuple(
    t for t in (
        getattr(kerr, "AuthorizationError", None), getattr(kerr, "SaslAuthenticationFailedError", None),
        getattr(kerr, "AuthenticationFailedError", None), getattr(kerr, "UnsupportedCodecError", None),
        getattr(kerr, "FencedInstanceIdError", None), getattr(kerr, "UnsupportedSaslMechanismError", None),
    ) if isinstance(t, type)
)


class FatalKafkaError(RankwatchError):
    """A Kafka error no retry can cure; the message is the one-line reason the process ends with."""

    cause: BaseException | None = None  # the kafka-python error, when there was one


def is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, FatalKafkaError) or isinstance(exc, _FATAL_TYPES) or "Authentication" in type(exc).__name__


def is_retriable(exc: BaseException) -> bool:
    """An outage: the broker is unreachable, slow, or moving leaders/coordinators (retry later)."""
    if is_fatal(exc):
        return False
    if isinstance(exc, (OSError, TimeoutError, getattr(kerr, "NoBrokersAvailable", OSError))):
        return True
    return isinstance(exc, kerr.KafkaError) and bool(getattr(exc, "retriable", False))


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


class KafkaOutage:
    """Whether Kafka is reachable, since when not, and how long to wait before the next retry.

    Thread-safe: the rebalance listener (kafka-python's I/O thread) reports failures too.

    Parameters
    ----------
    backoff_initial_s, backoff_max_s
        First retry delay ``d_0`` and the cap ``d_max``.
    clock
        Monotonic seconds (tests pass a fake).
    resource
        What is unreachable, for the log lines (``Kafka``; the schema registry's gate names the registry).
    """

    def __init__(self, *, backoff_initial_s: float = 0.2, backoff_max_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None,
                 resource: str = "Kafka") -> None:
        self.resource = resource
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0
        self._closed_seconds = 0.0
        self.outages = 0
        self.last_contact = clock()

    @property
    def active(self) -> bool:
        return self._since is not None

    def seconds_total(self) -> float:
        """Seconds spent in outages so far, the current one included."""
        with self._lock:
            current = 0.0 if self._since is None else self._clock() - self._since
            return self._closed_seconds + current

    def failed(self, step: str, exc: BaseException) -> None:
        """Record a retriable failure of ``step``; the first one of an outage is logged."""
        with self._lock:
            self._failures += 1
            if self._since is None:
                self._since = self._clock()
                self.outages += 1
                log.warning("%s unreachable (%s: %s); retrying with backoff up to %.0f s",
                            self.resource, step, one_line(exc), self.backoff_max_s)

    def group_event(self) -> None:
        """A step refused by the group (e.g. a commit during a rebalance): back off, but no outage."""
        with self._lock:
            self._failures += 1

    def succeeded(self) -> None:
        """A step reached the broker: an outage in progress ends (one log line)."""
        with self._lock:
            now = self._clock()
            self.last_contact = now
            self._failures = 0
            if self._since is not None:
                length = now - self._since
                self._closed_seconds += length
                self._since = None
                log.info("%s reachable again after %.1f s", self.resource, length)

    def backoff(self) -> float:
        """Delay before the next retry (0 when no failure is pending)."""
        with self._lock:
            n = self._failures
        if n == 0:
            return 0.0
        base = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(n - 1, 30))
        return base * self._rng.uniform(0.5, 1.0)

    def attempt(self, step: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[bool, T | None]:
        """Run one Kafka step: ``(True, result)``, or ``(False, None)`` after a retriable error.

        Raises :class:`FatalKafkaError` on a fatal error; other errors propagate unchanged.
        """
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            if is_fatal(e):
                if isinstance(e, FatalKafkaError):
                    raise
                fatal = FatalKafkaError(f"Kafka refused {step}: {one_line(e)}")
                fatal.cause = e  # the service names the resource from it (consumers/connect.explain)
                raise fatal from None
            if is_retriable(e):
                self.failed(step, e)
                return False, None
            raise
        return True, result
