"""HTTP endpoint: ``/metrics`` (prometheus-client exposition), ``/healthz`` (liveness), ``/readyz`` (readiness).

Optional TLS (certificate and key files, optionally client certificates) and HTTP basic auth, configured
like every official Prometheus exporter: :func:`load_web_config` reads the exporter-toolkit web
configuration file (``tls_server_config``, ``basic_auth_users`` with bcrypt hashes); the older
``[exporter]`` keys map onto the same :class:`WebConfig`. Basic auth protects ``/metrics`` only:
orchestrator probes usually cannot send credentials, and the probes reveal nothing but "ok". Credentials
are compared in constant time. When the registry is the collector's own :class:`RankwatchRegistry`, ``/metrics``
is served from its :class:`~exporters.collector.CachedExposition` (identical bytes, rendered once per state
change); with a query string (``name[]`` filters) or other collectors registered, prometheus-client's own
app renders it. Each request is served on its own thread (the server's accept loop runs on
one background thread); :meth:`MetricsServer.stop` shuts it down and closes the socket.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import gzip_accepted
from prometheus_client.registry import CollectorRegistry

from rankwatch.exporters.collector import CachedExposition

DEFAULT_BIND = "127.0.0.1"
DEFAULT_PORT = 9108

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")


@dataclass(frozen=True)
class TLSConfig:
    certfile: str
    keyfile: str
    client_auth_type: str = "NoClientCert"  # exporter-toolkit's names
    client_ca_file: str | None = None


@dataclass(frozen=True)
class BcryptUsers:
    """``basic_auth_users`` of the web config: user -> bcrypt hash (the hashes are not secrets, but the
    passwords they check are never stored)."""

    users: tuple[tuple[str, bytes], ...]

    def __repr__(self) -> str:
        return f"BcryptUsers({[u for u, _ in self.users]!r})"

    def accepts(self, header: str | None) -> bool:
        import bcrypt

        parsed = _parse_basic(header)
        if parsed is None:
            return False
        user, password = parsed
        ok = False
        for name, hashed in self.users:
            if hmac.compare_digest(name.encode(), user.encode()):
                try:
                    ok = bcrypt.checkpw(password.encode(), hashed)
                except ValueError:
                    ok = False
        return ok


@dataclass(frozen=True)
class WebConfig:
    tls: TLSConfig | None = None
    auth: BasicAuth | BcryptUsers | None = None


def load_web_config(path: str) -> WebConfig:
    """The exporter-toolkit web configuration file (YAML); ``ValueError`` naming the key on a problem.

    Relative file names in it are relative to the file's folder, as in exporter-toolkit.
    """
    import os

    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {type(e).__name__}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping")
    unknown = sorted(set(raw) - {"tls_server_config", "basic_auth_users", "http_server_config"})
    if unknown:
        raise ValueError(f"{path}: {unknown[0]}: unknown key (known: basic_auth_users, tls_server_config)")
    here = os.path.dirname(os.path.abspath(path))

    def rel(name: str) -> str:
        return name if os.path.isabs(name) else os.path.join(here, name)

    tls = None
    t = raw.get("tls_server_config")
    if t:
        if not isinstance(t, dict) or not t.get("cert_file") or not t.get("key_file"):
            raise ValueError(f"{path}: tls_server_config: needs cert_file and key_file")
        kind = t.get("client_auth_type", "NoClientCert")
        if kind not in CLIENT_AUTH_TYPES:
            raise ValueError(f"{path}: tls_server_config.client_auth_type: one of {', '.join(CLIENT_AUTH_TYPES)}")
        ca = t.get("client_ca_file")
        if kind in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
            raise ValueError(f"{path}: tls_server_config.client_ca_file: needed by client_auth_type {kind}")
        tls = TLSConfig(rel(t["cert_file"]), rel(t["key_file"]), kind, rel(ca) if ca else None)
    auth = None
    users = raw.get("basic_auth_users")
    if users:
        if not isinstance(users, dict) or not all(isinstance(v, str) and v.startswith("$2") for v in users.values()):
            raise ValueError(f"{path}: basic_auth_users: expected user: bcrypt-hash pairs")
        auth = BcryptUsers(tuple((str(u), h.encode()) for u, h in users.items()))
    return WebConfig(tls=tls, auth=auth)


@dataclass(frozen=True)
class BasicAuth:
    username: str
    password: str = ""

    @classmethod
    def from_file(cls, username: str, password_file: str) -> BasicAuth:
        """The password from a file (its content, one trailing newline stripped: the ``<key>_file``
        convention of docs/security.md); keeps the secret out of configuration files and process listings."""
        with open(password_file, encoding="utf-8", newline="") as fh:
            password = fh.read()
        password = password[:-2] if password.endswith("\r\n") else password.removesuffix("\n")
        if not password:
            raise ValueError(f"{password_file}: empty password")
        return cls(username, password)

    def __repr__(self) -> str:  # never print the password
        return f"BasicAuth(username={self.username!r}, password='***')"

    def accepts(self, header: str | None) -> bool:
        parsed = _parse_basic(header)
        if parsed is None:
            return False
        user, password = parsed
        ok_user = hmac.compare_digest(user.encode(), self.username.encode())
        ok_password = hmac.compare_digest(password.encode(), self.password.encode())
        return ok_user and ok_password


def _parse_basic(header: str | None) -> tuple[str, str] | None:
    if not header or not header.startswith("Basic "):
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that fails the TLS handshake or hangs up mid-response is not the exporter's error.
        pass


class _ThreadingWSGIServerV6(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 30  # seconds a connection may stay silent

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        pass


def _text(
    start_response: StartResponse, status: str, body: bytes, headers: list[tuple[str, str]] | None = None
) -> list[bytes]:
    start_response(
        status,
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))), *(headers or [])],
    )
    return [body]


def exporter_app(
    registry: CollectorRegistry, *, auth: BasicAuth | BcryptUsers | None = None,
    ready: Callable[[], bool] = lambda: True
) -> WSGIApp:
    """The WSGI application: routes, basic auth on ``/metrics``, readiness from ``ready()``."""
    metrics_app = make_wsgi_app(registry)

    def exposition_now() -> CachedExposition | None:
        # Looked up per request: registering another collector later turns the cache off.
        return getattr(registry, "exposition", None)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/healthz":
            return _text(start_response, "200 OK", b"ok\n")
        if path == "/readyz":
            if ready():
                return _text(start_response, "200 OK", b"ready\n")
            return _text(start_response, "503 Service Unavailable", b"not ready\n")
        if path in ("/metrics", "/"):
            exposition = exposition_now()
            if auth is not None and not auth.accepts(environ.get("HTTP_AUTHORIZATION")):
                return _text(
                    start_response,
                    "401 Unauthorized",
                    b"authentication required\n",
                    [("WWW-Authenticate", 'Basic realm="rankwatch"')],
                )
            if exposition is not None and not environ.get("QUERY_STRING"):
                return _cached_metrics(exposition, environ, start_response)
            environ = {**environ, "PATH_INFO": "/metrics"}
            return metrics_app(environ, start_response)
        return _text(start_response, "404 Not Found", b"not found\n")

    return app


def _cached_metrics(
    exposition: CachedExposition, environ: dict[str, Any], start_response: StartResponse
) -> list[bytes]:
    """``/metrics`` from the collector's cached exposition (same bytes and headers as prometheus-client's
    app; gzip at level 1 when accepted: nearly the size of level 9 for this text, at a fraction of the CPU)."""
    body, content_type = exposition.render(environ.get("HTTP_ACCEPT"))
    headers = [("Content-Type", content_type)]
    if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
        body = gzip.compress(body, compresslevel=1)
        headers.append(("Content-Encoding", "gzip"))
    headers.append(("Content-Length", str(len(body))))
    start_response("200 OK", headers)
    return [body]


class MetricsServer:
    """The exporter's HTTP(S) server on a background thread.

    ``port=0`` picks a free port; :attr:`port` tells which one after :meth:`start`.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        bind: str = DEFAULT_BIND,
        port: int = DEFAULT_PORT,
        tls: TLSConfig | None = None,
        auth: BasicAuth | BcryptUsers | None = None,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self._app = exporter_app(registry, auth=auth, ready=ready)
        self.bind = bind
        self.port = port
        self.tls = tls
        self._server: _ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        return f"{scheme}://{host}:{self.port}"

    def start(self) -> MetricsServer:
        """Bind and serve. Raises ``OSError`` when the address is taken, ``ssl.SSLError``/``OSError`` on bad TLS files."""
        context = None
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(self.tls.certfile, self.tls.keyfile)
            kind = self.tls.client_auth_type
            if kind != "NoClientCert":
                if self.tls.client_ca_file:
                    context.load_verify_locations(self.tls.client_ca_file)
                # Python's ssl verifies what it requests: RequireAndVerifyClientCert and RequireAnyClientCert
                # need a trusted certificate; the "IfGiven"/"Request" kinds verify one when it comes.
                required = kind in ("RequireAndVerifyClientCert", "RequireAnyClientCert")
                context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
        server_class = _ThreadingWSGIServerV6 if ":" in self.bind else _ThreadingWSGIServer
        server = make_server(
            self.bind, self.port, self._app, server_class=server_class, handler_class=_QuietHandler
        )
        if context is not None:
            # Handshake on the request's own thread (see _QuietHandler.setup), not in the accept loop, so a
            # client that connects and stalls cannot block other scrapes.
            server.socket = context.wrap_socket(
                server.socket, server_side=True, do_handshake_on_connect=False
            )
        self.port = int(server.server_address[1])
        self._server = server  # type: ignore[assignment]
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name="rankwatch-exporter-http",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
