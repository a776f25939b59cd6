"""Settings of the Kafka side of ``rankwatch run``: where to read, how to checkpoint, what to pass to kafka-python.

The streaming core's own settings are :class:`pipeline.stream.processor.StreamConfig`; ``rankwatch/config.py`` reads
both from one TOML file. Names follow the TOML keys of the ``[kafka]`` table (docs/kafka.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

# kafka-python client options a user may pass through (security and connection tuning). Anything else is
# refused at config time, so a typo fails at start instead of being ignored by the client.
PASSTHROUGH_OPTIONS = frozenset({
    "security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_crlfile",
    "ssl_check_hostname", "ssl_ciphers", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
    "sasl_kerberos_service_name", "sasl_kerberos_domain_name", "client_id", "request_timeout_ms",
    "connections_max_idle_ms", "reconnect_backoff_ms", "reconnect_backoff_max_ms", "retry_backoff_ms",
    "metadata_max_age_ms", "api_version", "bootstrap_timeout_ms",
})

# Options holding a secret: each may instead be read from a file, ``<option>_file`` (docs/security.md).
SECRET_OPTIONS = ("sasl_plain_password", "ssl_password")
SECRET_FILE_OPTIONS = frozenset(f"{name}_file" for name in SECRET_OPTIONS)


class Secret:
    """A secret value that never prints: ``repr``/``str`` give ``'***'``; :meth:`reveal` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def read_secret_file(path: str | Path) -> Secret:
    """The content of a secret file, stripped of one trailing newline (the ``<key>_file`` convention).

    Raises ``ValueError`` naming the file (never its content) when it is missing, unreadable or empty.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read {path}: {type(e).__name__}") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise ValueError(f"{path} is empty")
    return Secret(text)


def security_options(raw: Mapping[str, Any], base: Path) -> dict[str, Any]:
    """The ``[kafka.security]`` table as client options: ``<secret>_file`` read (relative to ``base``),
    secrets wrapped in :class:`Secret`. Raises ``ValueError("<key>: <problem>")``."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SECRET_FILE_OPTIONS:
            option = key[: -len("_file")]
            if option in raw:
                raise ValueError(f"{key}: give either {option} or {key}, not both")
            if not isinstance(value, str) or not value:
                raise ValueError(f"{key}: expected a file name")
            try:
                out[option] = read_secret_file(base / value)
            except ValueError as e:
                raise ValueError(f"{key}: {e}") from None
            continue
        if key not in PASSTHROUGH_OPTIONS:
            known = ", ".join(sorted(PASSTHROUGH_OPTIONS | SECRET_FILE_OPTIONS))
            raise ValueError(f"{key}: not a supported kafka-python option (known: {known})")
        if not isinstance(value, str | int | bool):
            raise ValueError(f"{key}: expected a string, integer or boolean")
        out[key] = Secret(value) if key in SECRET_OPTIONS and isinstance(value, str) else value
    return out


@dataclass(frozen=True)
class KafkaSettings:
    """Where ``rankwatch run`` reads from and writes its checkpoints and dead letters.

    Parameters
    ----------
    bootstrap_servers
        ``host:port`` of one or more brokers.
    impressions_topic, clicks_topic
        The two input topics; they must have the same number of partitions and be keyed by ``request_id``.
    group_id
        The consumer group; every instance of one service uses the same group.
    checkpoint_topic
        Compacted topic of state checkpoints (default ``<group_id>.checkpoints``); created on start with as
        many partitions as the input topics when missing.
    dead_letter_topic
        Where rejected events go, with their origin in headers (default ``<group_id>.dead-letters``).
    checkpoint_interval_s
        Seconds between checkpoints of a partition pair while traffic flows (also taken on revoke and
        shutdown). A crash replays at most about this much traffic.
    auto_offset_reset
        Where a partition with neither a checkpoint nor a committed offset starts: ``"earliest"`` (default:
        every retained event counts) or ``"latest"``.
    max_poll_records, max_buffered_records
        Records per poll; records buffered per topic-partition before fetching from it pauses.
    max_partition_fetch_bytes
        The most bytes one fetch brings of one partition (kafka-python's option; its default is 1 MiB). A
        backlog is read in fewer, larger fetches: 4 MiB by default, which kept the consuming thread waiting
        for fetch answers less (docs/benchmarks.md, "Kafka end to end"). A fetch answer holds at most this
        times the partitions it asked for, and at most kafka-python's ``fetch_max_bytes`` (50 MiB).
    tick_interval_s
        How often idle pairs let the clock move their watermark (windows close when traffic stops).
    session_timeout_s
        A member silent this long (crashed) is removed from the group and its pairs move to the others.
    instance_id
        Static group membership (KIP-345): a restarted instance with the same id gets its partitions back
        at once, without a rebalance; a stopped one keeps them until ``session_timeout_s`` passes.
    client_options
        kafka-python options passed to every client (security: SSL/SASL; see ``PASSTHROUGH_OPTIONS``).
    shutdown_timeout_s
        Bound of the clean exit on SIGTERM (final checkpoint, commit, closing the clients), also when the
        broker is unreachable; ``rankwatch run`` forces the exit 10 s after it (docs/kafka.md).
    retry_backoff_max_s
        Cap of the backoff between retries during a Kafka outage (consumers/outage.py); also caps
        kafka-python's own reconnect backoff, so a returning broker is seen within about this long.
    core_process
        Run the streaming core in a second process (consumers/core_process.py, default): consuming and
        computing overlap on two cores. ``False`` keeps it in the consuming process (one core).
    overtake_grace_s
        How long a caught-up topic must stay empty before the other topic's records far ahead of it (more
        than the allowed disorder) are fed (consumers/alignment.py, "Overtaking waits"); 0 disables the wait.
    timestamps
        How the two topics are merged before the core (consumers/alignment.py): ``"event"`` (default) by
        each event's own (mapped) time, ``"record"`` by the Kafka record timestamps, which are event time
        only when the producers set them so (docs/kafka.md, "Ordering the two topics").
    """

    bootstrap_servers: tuple[str, ...] = ("127.0.0.1:9092",)
    impressions_topic: str = "impressions"
    clicks_topic: str = "clicks"
    group_id: str = "rankwatch"
    checkpoint_topic: str | None = None
    dead_letter_topic: str | None = None
    checkpoint_interval_s: float = 10.0
    auto_offset_reset: str = "earliest"
    max_poll_records: int = 2000
    max_buffered_records: int = 20_000
    max_partition_fetch_bytes: int = 4 * 1024 * 1024
    tick_interval_s: float = 1.0
    session_timeout_s: float = 10.0
    instance_id: str | None = None
    client_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    shutdown_timeout_s: float = 15.0
    retry_backoff_max_s: float = 5.0
    core_process: bool = True
    timestamps: str = "event"
    overtake_grace_s: float = 0.25

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ValueError("bootstrap_servers must name at least one broker")
        if self.impressions_topic == self.clicks_topic:
            raise ValueError("impressions_topic and clicks_topic must differ")
        if self.timestamps not in ("event", "record"):
            raise ValueError("timestamps must be 'event' or 'record'")
        if self.auto_offset_reset not in ("earliest", "latest"):
            raise ValueError("auto_offset_reset must be 'earliest' or 'latest'")
        for name in ("checkpoint_interval_s", "tick_interval_s", "session_timeout_s", "shutdown_timeout_s",
                     "retry_backoff_max_s"):
            if float(getattr(self, name)) <= 0:
                raise ValueError(f"{name} must be > 0")
        if self.overtake_grace_s < 0:
            raise ValueError("overtake_grace_s must be >= 0")
        for name in ("max_poll_records", "max_buffered_records", "max_partition_fetch_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1")
        unknown = sorted(set(self.client_options) - PASSTHROUGH_OPTIONS)
        if unknown:
            raise ValueError(f"unsupported client option {unknown[0]!r}")

    @property
    def checkpoints(self) -> str:
        return self.checkpoint_topic or f"{self.group_id}.checkpoints"

    @property
    def dead_letters(self) -> str:
        return self.dead_letter_topic or f"{self.group_id}.dead-letters"

    def client_kwargs(self) -> dict[str, Any]:
        """Options of every kafka-python client of rankwatch (``run``'s consumer, producers and end-offset
        client, ``simulate``, ``inspect``): the one place security options and secrets reach the clients."""
        # kafka-python's reconnect backoff grows to 30 s by default: after an outage the broker would be
        # seen again up to 30 s late. Capped at our own retry cap unless the user set it. Its bootstrap
        # waits 30 s by default inside a constructor: bounded by the session timeout here.
        backoff_ms = int(self.retry_backoff_max_s * 1000)
        options = {k: v.reveal() if isinstance(v, Secret) else v for k, v in self.client_options.items()}
        return {"bootstrap_servers": list(self.bootstrap_servers), "reconnect_backoff_max_ms": backoff_ms,
                "bootstrap_timeout_ms": int(max(5.0, self.session_timeout_s) * 1000), **options}
