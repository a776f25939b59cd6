"""Opening kafka-python clients within a bound: abandonable waits, no leaked threads, failures named.

Layout: :class:`ClientSet` (the clients of one start attempt: every construction and blocking call runs on
a worker thread the caller waits for with a deadline and a stop event; a failed or abandoned attempt closes
every client it made), :func:`check_connection` (one connection to a bootstrap server, as the clients make
it, whose TLS or SASL failure becomes a one-line :class:`FatalKafkaError`), :func:`explain` (the one line
for an authentication, TLS or authorization error), :func:`install_recv_fix` (a kafka-python repair).

Why: kafka-python 3.0.12 constructors bootstrap before returning (``KafkaConsumer.__init__``,
``KafkaAdminClient.__init__``), start an I/O thread first, and keep it running when the bootstrap fails:
every retry of a failing start leaked a thread. Its metadata calls (``topics()``) wait without a bound,
so a SIGTERM during start-up was never honoured. And it reports a wrong password or a CA that
does not match as ``KafkaTimeoutError: Unable to bootstrap`` after retrying for the bootstrap timeout,
so the cause was never named and the service retried for good. The broker does answer a failed SCRAM
exchange with ``SASL_AUTHENTICATION_FAILED`` and then closes the connection; kafka-python reads the answer
and the end of the stream in one ``recv`` loop and drops the answer (:func:`install_recv_fix`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kafka import errors as kerr

from rankwatch.consumers.outage import FatalKafkaError

log = logging.getLogger(__name__)

# Secrets never shown in an error or a log line (consumers/settings.py redacts the same keys).
SECRET_OPTIONS = frozenset({"sasl_plain_password", "ssl_password"})


class Stopped(Exception):
    """The wait was abandoned because the process is stopping (SIGTERM)."""


# The digest of kafka-python 3.0.12's ``KafkaTCPTransport._read_from_sock`` source, the method
# :func:`install_recv_fix` replaces; tests/consumers/test_fetch_compat.py fails when it differs.
RECV_FIX_VERIFIED_DIGEST = "572fe643c70751bf"


def recv_source_digest() -> str:
    """The first 16 hex digits of the SHA-256 of the installed ``_read_from_sock`` source (the original)."""
    import hashlib
    import inspect

    from kafka.net import transport

    original = getattr(transport.KafkaTCPTransport, "_rankwatch_original_read", None) or \
        transport.KafkaTCPTransport._read_from_sock
    return hashlib.sha256(inspect.getsource(original).encode()).hexdigest()[:16]


def install_recv_fix() -> None:
    """Deliver the bytes read before the broker closed the connection, then close it (idempotent).

    kafka-python's ``_read_from_sock`` aborts on end-of-stream without handing over the data read in the
    same loop: the broker's ``SaslAuthenticateResponse`` with the failure, sent just before it closes, was
    lost and the error became "socket disconnected". The repair hands the data over, lets the task waiting
    for that response run (one turn of the loop), and closes as before. Nothing changes when no data came
    with the end-of-stream.
    """
    from kafka.net import transport

    cls: Any = transport.KafkaTCPTransport
    if getattr(cls, "_rankwatch_recv_fix", False):
        return
    if (found := recv_source_digest()) != RECV_FIX_VERIFIED_DIGEST:
        # Another kafka-python: replacing a method it changed could break its reads. Leave it; the cause
        # of an authentication failure is then named from the log only (tests fail on this, see below).
        log.warning("kafka-python's KafkaTCPTransport._read_from_sock is not the one the recv repair was "
                    "verified on (digest %s, expected %s): repair not installed", found, RECV_FIX_VERIFIED_DIGEST)
        return

    async def _read_from_sock(self: Any) -> Any:
        while self._read and not self._closed:
            await self._net.wait_read(self._sock)
            data, err = self._sock_recv()
            if data:
                self.last_read = time.monotonic()
                if self._protocol and self._protocol._sensors:
                    self._protocol._sensors.bytes_received.record(len(data))
                try:
                    self._protocol.data_received(data)
                except kerr.KafkaProtocolError as e:
                    return self.abort(error=e)
            if err:
                if data:
                    await self._net.sleep(0)  # the response's waiter runs before the connection closes
                return self.abort(error=err)
        return None

    cls._rankwatch_original_read = cls._read_from_sock
    cls._read_from_sock = _read_from_sock
    cls._rankwatch_recv_fix = True


class _NoSaslBytes(logging.Filter):
    """Drops kafka-python's debug lines that print SASL requests (a PLAIN request carries the password)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to fix
            return True
        return "SaslAuthenticate" not in text and "SaslBytes" not in text


def hide_sasl_in_logs() -> None:
    """Install :class:`_NoSaslBytes` on the root logger's handlers (``--log-level debug`` shows kafka-python)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _NoSaslBytes) for f in handler.filters):
            handler.addFilter(_NoSaslBytes())


def _where(kwargs: Mapping[str, Any]) -> str:
    servers = kwargs.get("bootstrap_servers") or []
    return ",".join([servers] if isinstance(servers, str) else list(servers))


def explain(exc: BaseException, kwargs: Mapping[str, Any], *, resource: str = "") -> str | None:
    """The one line for an authentication, TLS or authorization failure (None: not one of those).

    ``resource`` names what was asked for (``topic 'impressions'``, ``group 'rankwatch'``), when known.
    The line never contains a secret: only the user name, mechanism, address and the config key to check.
    """
    where, user = _where(kwargs), kwargs.get("sasl_plain_username")
    mechanism = kwargs.get("sasl_mechanism") or "PLAIN"
    text = " ".join(str(exc).split())
    if isinstance(exc, kerr.SaslAuthenticationFailedError | kerr.IllegalSaslStateError):
        return (f"Kafka authentication failed for user {user!r} at {where} ({mechanism}): "
                "check sasl_plain_username and sasl_plain_password_file (or sasl_plain_password)")
    if isinstance(exc, kerr.UnsupportedSaslMechanismError):
        return f"Kafka at {where} does not accept SASL mechanism {mechanism}: {text[:200]}"
    if isinstance(exc, kerr.AuthorizationError):
        what = resource or {
            kerr.TopicAuthorizationFailedError: "a topic", kerr.GroupAuthorizationFailedError: "the group",
            kerr.ClusterAuthorizationFailedError: "the cluster",
        }.get(type(exc), "a resource")
        principal = f"user {user!r}" if user else "this client"
        return (f"Kafka authorization failed: {principal} is not allowed to use {what} at {where} "
                f"({type(exc).__name__}): grant the ACLs of docs/security.md")
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        reason = text.split("certificate verify failed:", 1)[-1].split("(_ssl")[0].strip(" :") or "not trusted"
        return (f"TLS handshake with Kafka at {where} failed: the broker's certificate is not trusted "
                f"({reason}): check ssl_cafile")
    if "Handshake failed" in text and "SSL" in text:
        return f"TLS handshake with Kafka at {where} failed ({text[:200]}): check security_protocol and the ssl_* keys"
    return None


def fatal(exc: BaseException, kwargs: Mapping[str, Any], *, resource: str = "") -> BaseException:
    """``exc`` as a :class:`FatalKafkaError` with :func:`explain`'s line when it is one of those, else ``exc``."""
    line = explain(exc, kwargs, resource=resource)
    return FatalKafkaError(line) if line is not None else exc


def check_connection(kwargs: Mapping[str, Any], timeout_s: float, clients: ClientSet | None = None) -> None:
    """Connect to one bootstrap server the way every client will (TLS, SASL) and close again.

    Raises :class:`FatalKafkaError` (one line) when TLS or SASL fails, a retriable Kafka error when the
    broker is unreachable; bounded by ``timeout_s``. With ``clients`` the wait is abandoned on its stop
    event (the connection is closed with the set).
    """
    from kafka.net.compat import KafkaNetClient

    install_recv_fix()
    bound_ms = int(timeout_s * 1000)
    client = KafkaNetClient(**{**kwargs, "request_timeout_ms": bound_ms})
    manager = client._manager

    async def connect() -> None:
        broker = manager.cluster.bootstrap_brokers()[0]
        conn = manager.get_connection(broker.node_id, timeout_ms=bound_ms)
        await conn

    client._net.start()  # waits on an event that closing the client releases
    try:
        if clients is None:
            client._net.run(connect)
        else:
            clients._clients.append(client)
            clients.call("connecting to Kafka", client._net.run, connect, timeout_s=timeout_s + 1.0)
    except Exception as e:
        raise fatal(e, kwargs) from None
    finally:
        if clients is not None:
            clients.discard(client)
        else:
            client.close()


class ClientSet:
    """The kafka-python clients of one attempt; every wait bounded and abandoned on ``stop``.

    Parameters
    ----------
    stop
        Set when the process is stopping: a wait in progress is abandoned (:class:`Stopped`).
    timeout_s
        Bound of each construction or call (a ``KafkaTimeoutError``, retriable, when it passes).
    """

    def __init__(self, stop: threading.Event | None = None, *, timeout_s: float = 10.0) -> None:
        self.stop = stop
        self.timeout_s = timeout_s
        self._clients: list[Any] = []

    def open(self, cls: Any, what: str, **kwargs: Any) -> Any:
        """``cls(**kwargs)`` (its bootstrap included) within the bound; closed with the set on failure."""
        install_recv_fix()
        obj = cls.__new__(cls)
        self._clients.append(obj)  # before __init__: a half-made client (I/O thread running) is closed too
        self.call(f"connecting the {what}", obj.__init__, **kwargs)
        return obj

    def call(self, what: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a worker thread; the caller waits up to the bound, or until ``stop``.

        On a timeout or a stop every client of the set is closed (which releases the worker's wait).
        """
        box: dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["error"] = e
            finally:
                done.set()

        bound = self.timeout_s if timeout_s is None else timeout_s
        threading.Thread(target=work, name="rankwatch-kafka-call", daemon=True).start()
        deadline = time.monotonic() + bound
        while not done.wait(0.05):
            if self.stop is not None and self.stop.is_set():
                self.close()
                raise Stopped(what)
            if time.monotonic() > deadline:
                self.close()
                raise kerr.KafkaTimeoutError(f"{what}: no answer within {bound:.0f} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def discard(self, obj: Any, timeout_s: float = 2.0) -> None:
        """Close one client of the set now (bounded)."""
        if obj in self._clients:
            self._clients.remove(obj)
        worker = threading.Thread(target=_close_one, args=(obj, timeout_s), name="rankwatch-kafka-close", daemon=True)
        worker.start()
        worker.join(timeout_s + 0.5)

    def release(self) -> None:
        """The clients made so far now belong to the caller (not closed by :meth:`close`)."""
        self._clients.clear()

    def close(self, timeout_s: float = 2.0) -> None:
        """Close every client of the set, half-made ones included; bounded by ``timeout_s`` in all."""
        clients, self._clients = self._clients, []
        if not clients:
            return
        def close_all() -> None:
            for c in clients:
                _close_one(c, timeout_s)

        worker = threading.Thread(target=close_all, name="rankwatch-kafka-close", daemon=True)
        worker.start()
        worker.join(timeout_s + 0.5)


def _close_one(obj: Any, timeout_s: float) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.net.compat import KafkaNetClient

    try:
        if isinstance(obj, KafkaNetClient):
            obj.close()
        elif isinstance(obj, KafkaProducer) and hasattr(obj, "_closed"):
            from rankwatch.consumers.clients import close_producer

            close_producer(obj, min(timeout_s, 1.0))
        elif isinstance(obj, KafkaConsumer) and hasattr(obj, "_closed"):
            obj.close(autocommit=False, timeout_ms=int(min(timeout_s, 1.0) * 1000))
        elif hasattr(obj, "_closed") and hasattr(obj, "close"):
            obj.close()
        else:  # construction did not finish: stop its network client and I/O thread directly
            client = getattr(obj, "_client", None)
            if client is not None:
                client.close()
            net = getattr(obj, "_net", None)
            if net is not None:
                net.stop(timeout_ms=int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001 - closing is best effort
        log.debug("closing an abandoned Kafka client: %s", e)
