"""The Schema Registry client: schema ids to schemas over a Confluent-compatible REST API, errors sorted.

Layout: :class:`RegistrySettings` (the ``[schema_registry]`` table: ``url``, ``basic_auth_user``,
``basic_auth_password_file``, ``timeout``), :class:`SchemaRegistry` (``schema(id)``, ``schema_of(type)``
for the decoders of ``pipeline.events.formats``, ``register``, ``check``), and
:func:`confluent_avro_encoder` for the simulator.

It wraps confluent-kafka's ``SchemaRegistryClient`` (HTTP only; it works beside any Kafka consumer) against
Confluent Schema Registry, Apicurio Registry (``http://host:port/apis/ccompat/v7``), Karapace, ... Why the
wrapper: the decoders must tell bad input from an outage, and the client reports both as exceptions of
its own. Here:

* the registry answers 404 (or 400) for an id -> :class:`UnknownSchema`: the message is bad input
  (``unknown_schema``: counted, dead-lettered). A miss is remembered for ``miss_ttl`` seconds so a flood of
  bad ids does not become a flood of requests; a schema registered later is found after that.
* connection refused, a timeout, 5xx, 408/429, or an answer that is not the API -> :class:`RegistryUnavailable`:
  an outage (the consuming layer retries the message; nothing is dead-lettered or skipped).
* 401/403 -> :class:`RegistryRefused`, a configuration error (wrong credentials do not heal by retrying;
  like Kafka's authentication errors, it ends the process with one line).

Every request is bounded: one attempt of at most ``timeout`` seconds per phase (the client's own
retries are off; the consuming layer owns backoff). Found schemas are cached forever (ids are immutable).
The password is read from its file, sent as HTTP basic auth, and appears in no message or repr.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rankwatch.pipeline.errors import ConfigError
from rankwatch.pipeline.events.formats import RegistryUnavailable, UnknownSchema, install_hint

DEFAULT_TIMEOUT = 5.0
MAX_SCHEMA_ID = 2**31 - 1  # ids are positive signed 32-bit integers; larger ones are never asked
_OUTAGE_STATUSES = {408, 425, 429}


class RegistryRefused(ConfigError):
    """The registry refused our credentials (401/403): a configuration error, not an outage."""


@dataclass(frozen=True)
class RegistrySettings:
    """The ``[schema_registry]`` table.

    Parameters
    ----------
    url
        Base URL of a Confluent-compatible API, e.g. ``http://127.0.0.1:8080/apis/ccompat/v7``;
        several comma-separated URLs fail over.
    basic_auth_user, basic_auth_password_file
        HTTP basic auth; both or neither. The file holds the password (one trailing newline ignored).
    timeout
        Seconds per HTTP phase (connect, read) of one look-up.
    """

    url: str
    basic_auth_user: str | None = None
    basic_auth_password_file: Path | None = None
    timeout: float = DEFAULT_TIMEOUT

    @classmethod
    def from_table(cls, table: Mapping[str, Any], *, where: str = "schema_registry",
                   base: Path | None = None) -> RegistrySettings:
        """Settings from the parsed TOML table; unknown keys or bad values are a one-line ConfigError.

        ``timeout`` is seconds (``5``, ``2.5``) or a duration (``"10s"``, ``"500ms"``); a relative
        ``basic_auth_password_file`` is read from ``base`` (the config file's folder)."""
        unknown = set(table) - {"url", "basic_auth_user", "basic_auth_password_file", "timeout"}
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        url = table.get("url")
        if not isinstance(url, str) or not url:
            raise ConfigError(f"{where}.url: required, a string like 'http://127.0.0.1:8081'")
        timeout = table.get("timeout", DEFAULT_TIMEOUT)
        if isinstance(timeout, str):
            from rankwatch.pipeline.stream.durations import parse_duration_ms

            try:
                timeout = parse_duration_ms(timeout) / 1000
            except ValueError:
                raise ConfigError(f"{where}.timeout: not a duration: {timeout!r} (use e.g. 5, 2.5 or '10s')") from None
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 300:
            raise ConfigError(f"{where}.timeout: seconds, a number in (0, 300]")
        user = table.get("basic_auth_user")
        password_file = table.get("basic_auth_password_file")
        for key, value in (("basic_auth_user", user), ("basic_auth_password_file", password_file)):
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{where}.{key}: a non-empty string")
        password_path = None if not password_file else (base or Path(".")) / password_file
        settings = cls(url.rstrip("/"), user, password_path, float(timeout))
        settings.validate(where)
        return settings

    def validate(self, where: str = "schema_registry") -> None:
        """Check the URLs and the auth pair (no I/O but reading nothing; the password file is read later)."""
        for url in self.url.split(","):
            parts = urlsplit(url.strip())
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"{where}.url: {redact(url.strip())!r} is not an http(s) URL")
            if parts.username or parts.password:
                raise ConfigError(f"{where}.url: put credentials in basic_auth_user / basic_auth_password_file")
        if (self.basic_auth_user is None) != (self.basic_auth_password_file is None):
            key = "basic_auth_password_file" if self.basic_auth_user else "basic_auth_user"
            raise ConfigError(f"{where}.{key}: basic auth needs both basic_auth_user and basic_auth_password_file")
        if self.basic_auth_user is not None and ":" in self.basic_auth_user:
            raise ConfigError(f"{where}.basic_auth_user: must not contain ':'")

    def read_password(self) -> str | None:
        if self.basic_auth_password_file is None:
            return None
        path = self.basic_auth_password_file
        try:
            password = path.read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise ConfigError(f"schema_registry.basic_auth_password_file {str(path)!r}: cannot read ({reason})") from None
        if not password:
            raise ConfigError(f"schema_registry.basic_auth_password_file {str(path)!r}: empty")
        return password


def redact(url: str) -> str:
    """``url`` without any user info, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else "")).geturl()  # type: ignore[operator]


@dataclass(frozen=True)
class RegistrySchema:
    """A schema as the registry holds it: ``schema_type`` is ``AVRO``, ``PROTOBUF`` or ``JSON``."""

    schema_id: int
    schema_type: str
    text: str


class SchemaRegistry:
    """Schema look-ups by id, cached, with errors sorted into bad input, outage and refusal.

    Parameters
    ----------
    settings
        The ``[schema_registry]`` table.
    client
        A ready ``SchemaRegistryClient`` (tests); built from ``settings`` when None.
    clock
        Monotonic seconds, for how long an unknown id stays unknown.
    miss_ttl
        Seconds an id the registry does not have is answered from memory.
    """

    def __init__(
        self,
        settings: RegistrySettings,
        *,
        client: Any = None,
        clock: Callable[[], float] = time.monotonic,
        miss_ttl: float = 30.0,
    ) -> None:
        self.settings = settings
        self.resource = f"schema registry {', '.join(redact(u.strip()) for u in settings.url.split(','))}"
        self._client = client if client is not None else self._build(settings)
        self._clock = clock
        self._miss_ttl = miss_ttl
        self._found: dict[int, RegistrySchema] = {}
        self._missed: dict[int, float] = {}

    @staticmethod
    def _build(settings: RegistrySettings) -> Any:
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as exc:
            raise ConfigError(
                f"[schema_registry] needs confluent-kafka's schema_registry package ({exc.name or exc} missing): "
                f"{install_hint('avro')} or {install_hint('protobuf')}"
            ) from None
        conf: dict[str, Any] = {
            "url": settings.url,
            "timeout": settings.timeout,
            "max.retries": 0,  # one bounded attempt; the consuming layer owns retries and backoff
        }
        password = settings.read_password()
        if password is not None:
            conf["basic.auth.user.info"] = f"{settings.basic_auth_user}:{password}"
        return SchemaRegistryClient(conf)

    def __repr__(self) -> str:
        return f"SchemaRegistry({self.resource!r}, timeout={self.settings.timeout})"

    def _error(self, exc: BaseException, what: str, schema_id: int | None = None) -> Exception:
        """The exception ``exc`` (raised by the client for ``what``) stands for."""
        status = getattr(exc, "http_status_code", None)
        if isinstance(status, int) and status > 0:
            message = str(getattr(exc, "error_message", "") or "").splitlines()[0:1]
            said = f": {message[0][:200]}" if message else ""
            if status in (401, 403):
                return RegistryRefused(
                    f"{self.resource}: {what} refused ({status}){said}; "
                    "check schema_registry.basic_auth_user / basic_auth_password_file"
                )
            if schema_id is not None and status in (400, 404, 422):
                return UnknownSchema(schema_id, f"schema id {schema_id} is not in the {self.resource} ({status})")
            if status >= 500 or status in _OUTAGE_STATUSES:
                return RegistryUnavailable(f"{self.resource}: {what} failed ({status}){said}")
            return RegistryUnavailable(f"{self.resource}: {what} answered {status}{said}")
        # httpx transport errors (refused, reset, DNS, timeouts), or an answer that is not the API
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        return RegistryUnavailable(f"{self.resource}: {what} failed ({type(exc).__name__}{': ' + text if text else ''})")

    def schema(self, schema_id: int) -> RegistrySchema:
        """The schema with ``schema_id``.

        Raises
        ------
        UnknownSchema
            The registry has no such id (or the id cannot be one); answered from memory for ``miss_ttl``.
        RegistryUnavailable
            The registry could not be asked.
        RegistryRefused
            The registry refused the credentials.
        """
        found = self._found.get(schema_id)
        if found is not None:
            return found
        if not 0 <= schema_id <= MAX_SCHEMA_ID:
            raise UnknownSchema(schema_id, f"schema id {schema_id} is outside the registry's 0..2**31-1")
        missed = self._missed.get(schema_id)
        if missed is not None and self._clock() - missed < self._miss_ttl:
            raise UnknownSchema(schema_id, f"schema id {schema_id} is not in the {self.resource}")
        try:
            got = self._client.get_schema(schema_id)
        except Exception as exc:
            error = self._error(exc, f"schema id {schema_id}", schema_id)
            if isinstance(error, UnknownSchema):
                if len(self._missed) > 10_000:
                    self._missed.clear()
                self._missed[schema_id] = self._clock()
            raise error from None
        text = got.schema_str
        if not isinstance(text, str):
            raise RegistryUnavailable(f"{self.resource}: schema id {schema_id} came back without a schema")
        schema = RegistrySchema(schema_id, (got.schema_type or "AVRO").upper(), text)
        self._missed.pop(schema_id, None)
        self._found[schema_id] = schema
        return schema

    def schema_of(self, schema_type: str) -> Callable[[int], str]:
        """``schema_of(schema_id) -> schema text`` for a decoder of ``schema_type`` (``AVRO``, ``PROTOBUF``).

        An id whose schema is of another type is :class:`UnknownSchema` (bad input: the producer wrote
        another format to this topic).
        """
        wanted = schema_type.upper()

        def schema_of(schema_id: int) -> str:
            schema = self.schema(schema_id)
            if schema.schema_type != wanted:
                raise UnknownSchema(
                    schema_id, f"schema id {schema_id} is a {schema.schema_type} schema, not {wanted}"
                )
            return schema.text

        return schema_of

    def register(self, subject: str, text: str, schema_type: str = "AVRO") -> int:
        """Register ``text`` under ``subject`` (or find it there); return its id.

        Raises
        ------
        RegistryUnavailable
            The registry could not be asked.
        RegistryRefused
            Credentials refused, or the schema rejected (invalid, incompatible: the message says why).
        """
        from confluent_kafka.schema_registry import Schema

        try:
            return int(self._client.register_schema(subject, Schema(text, schema_type.upper())))
        except Exception as exc:
            error = self._error(exc, f"registering subject {subject!r}")
            status = getattr(exc, "http_status_code", 0)
            if isinstance(status, int) and 400 <= status < 500 and status not in _OUTAGE_STATUSES:
                error = RegistryRefused(f"{self.resource}: subject {subject!r} refused the schema ({status}): "
                                        f"{str(getattr(exc, 'error_message', exc)).splitlines()[0][:200]}")
            raise error from None

    def check(self) -> None:
        """One bounded request (the subject list) to find a wrong URL or credentials at start-up."""
        try:
            self._client.get_subjects()
        except Exception as exc:
            raise self._error(exc, "listing subjects") from None


def confluent_avro_encoder(registry: SchemaRegistry, subject: str, schema_text: str) -> Any:
    """Register an Avro schema under ``subject`` and return a ConfluentAvroEncoder for its id."""
    from rankwatch.pipeline.events.formats.avro import ConfluentAvroEncoder, parse_schema

    schema_id = registry.register(subject, schema_text, "AVRO")
    return ConfluentAvroEncoder(schema_id, parse_schema(schema_text))
