"""The exporter's web config in the exporter-toolkit format: real HTTPS with certificates made here (openssl),
bcrypt basic auth on /metrics, client certificates required, probes open without credentials."""

from __future__ import annotations

import base64
import http.client
import ssl
import subprocess
from pathlib import Path

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, Counter

from rankwatch.exporters.http import MetricsServer, load_web_config


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
             "-subj", "/CN=test ca", "-days", "1", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign")
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
                      ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"),
                 "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-days", "1", "-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.pem"))
    return d


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("rankwatch_test_total", "a test counter", registry=registry).inc()
    return registry


def _get(port: int, path: str, ctx: ssl.SSLContext, auth: tuple[str, str] | None = None) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def _client_ctx(pki: Path, *, cert: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    return ctx


def test_https_with_bcrypt_users_guards_metrics_and_leaves_probes_open(pki: Path, tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"s3cret-pw", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.pem'}\n  key_file: {pki / 'server.key'}\n"
                   f"basic_auth_users:\n  prom: '{hashed}'\n")
    cfg = load_web_config(str(web))
    assert "s3cret" not in repr(cfg)
    with MetricsServer(_registry(), port=0, tls=cfg.tls, auth=cfg.auth) as server:
        ctx = _client_ctx(pki, cert=False)
        assert _get(server.port, "/metrics", ctx, ("prom", "s3cret-pw")) == 200
        assert _get(server.port, "/metrics", ctx, ("prom", "wrong")) == 401
        assert _get(server.port, "/metrics", ctx, ("other", "s3cret-pw")) == 401
        assert _get(server.port, "/metrics", ctx) == 401
        assert _get(server.port, "/healthz", ctx) == 200
        assert _get(server.port, "/readyz", ctx) == 200


def test_client_certificate_required(pki: Path, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.pem'}\n  key_file: {pki / 'server.key'}\n"
                   f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki / 'ca.pem'}\n")
    cfg = load_web_config(str(web))
    with MetricsServer(_registry(), port=0, tls=cfg.tls) as server:
        assert _get(server.port, "/metrics", _client_ctx(pki, cert=True)) == 200
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            _get(server.port, "/metrics", _client_ctx(pki, cert=False))


@pytest.mark.parametrize(("text", "needle"), [
    ("tls_server_config:\n  cert_file: a.pem\n", "cert_file and key_file"),
    ("basic_auth_users:\n  prom: plain-password\n", "bcrypt"),
    ("tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: Sometimes\n", "client_auth_type"),
    ("typo_key: 1\n", "typo_key"),
])
def test_bad_web_config_is_one_error_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    web = tmp_path / "web.yml"
    web.write_text(text)
    with pytest.raises(ValueError, match=needle) as info:
        load_web_config(str(web))
    assert "plain-password" not in str(info.value)
