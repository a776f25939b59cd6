"""HTTP endpoint: TLS and basic auth, probes, routes."""

from __future__ import annotations

import base64
import datetime as dt
import ssl
import urllib.error
import urllib.request

import numpy as np
import pytest
from exporter_helpers import grid_keys, one, parse_exposition, random_window, scrape

from rankwatch.exporters.collector import build_registry
from rankwatch.exporters.http import BasicAuth, MetricsServer, TLSConfig
from rankwatch.exporters.state import MetricsState


def self_signed(tmp_path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 / localhost: ``cryptography`` if installed, else ``openssl``."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        return _self_signed_openssl(tmp_path)
    return _self_signed_cryptography(tmp_path)


def _self_signed_openssl(tmp_path) -> tuple[str, str]:
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("neither the cryptography package nor the openssl command is available")
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(keyfile), "-out", str(certfile), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return str(certfile), str(keyfile)


def _self_signed_cryptography(tmp_path) -> tuple[str, str]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    import ipaddress

    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return str(certfile), str(keyfile)


def _state() -> MetricsState:
    state = MetricsState()
    state.publish_window(random_window(np.random.default_rng(5), grid_keys(("a",), ("x",))))
    return state


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def test_tls_and_basic_auth_refuse_unauthenticated_scrapes(tmp_path, free_port) -> None:
    certfile, keyfile = self_signed(tmp_path)
    server = MetricsServer(
        build_registry(_state()),
        port=free_port,
        tls=TLSConfig(certfile=certfile, keyfile=keyfile),
        auth=BasicAuth("prometheus", "s3cret"),
    ).start()
    try:
        assert server.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=certfile)
        # No credentials, wrong password, wrong user: 401 with a challenge.
        for headers in ({}, _basic("prometheus", "nope"), _basic("root", "s3cret")):
            with pytest.raises(urllib.error.HTTPError) as err:
                scrape(server.url, headers=headers, context=trusted)
            assert err.value.code == 401
            assert err.value.headers["WWW-Authenticate"].startswith("Basic")
        # Plain HTTP to a TLS port is not served.
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            scrape(server.url.replace("https://", "http://"), headers=_basic("prometheus", "s3cret"))
        # A client that does not trust the certificate refuses the connection.
        with pytest.raises(urllib.error.URLError):
            scrape(server.url, headers=_basic("prometheus", "s3cret"), context=ssl.create_default_context())
        series = parse_exposition(scrape(server.url, headers=_basic("prometheus", "s3cret"), context=trusted))
        assert one(series, "rankwatch_windows_published_total", window="5m") == 1
        # Probes answer without credentials (orchestrators cannot send them) and reveal nothing.
        with urllib.request.urlopen(server.url + "/healthz", context=trusted, timeout=10) as resp:
            assert resp.status == 200 and resp.read() == b"ok\n"
    finally:
        server.stop()


def test_probes_and_routes(free_port) -> None:
    ready = {"value": False}
    server = MetricsServer(build_registry(_state()), port=free_port, ready=lambda: ready["value"]).start()
    try:
        with urllib.request.urlopen(server.url + "/healthz", timeout=10) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "/readyz", timeout=10)
        assert err.value.code == 503
        ready["value"] = True
        with urllib.request.urlopen(server.url + "/readyz", timeout=10) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "/nope", timeout=10)
        assert err.value.code == 404
        assert "rankwatch_build_info" in scrape(server.url)
    finally:
        server.stop()
    server.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(server.url + "/healthz", timeout=2)


def test_port_in_use_is_an_error(free_port) -> None:
    first = MetricsServer(build_registry(_state()), port=free_port).start()
    try:
        with pytest.raises(OSError):
            MetricsServer(build_registry(_state()), port=free_port).start()
    finally:
        first.stop()


def test_basic_auth_parsing() -> None:
    auth = BasicAuth("u", "p:w")
    assert auth.accepts(_basic("u", "p:w")["Authorization"])
    assert not auth.accepts(None)
    assert not auth.accepts("Bearer xyz")
    assert not auth.accepts("Basic !!!notbase64")
    assert not auth.accepts("Basic " + base64.b64encode(b"no-colon").decode())
    assert "p:w" not in repr(auth)


def test_openmetrics_negotiation(free_port) -> None:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    server = MetricsServer(build_registry(_state()), port=free_port).start()
    try:
        req = urllib.request.Request(
            server.url + "/metrics", headers={"Accept": "application/openmetrics-text"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            text = resp.read().decode()
    finally:
        server.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["rankwatch_ranking_metric"].type == "summary"
    assert families["rankwatch_events"].type == "counter"
    assert any(s.labels.get("metric") == "ndcg@10" for s in families["rankwatch_ranking_quality"].samples)


def test_cached_metrics_gzip_and_name_filter(free_port) -> None:
    import gzip

    registry = build_registry(_state())
    server = MetricsServer(registry, port=free_port).start()
    try:
        req = urllib.request.Request(server.url + "/metrics", headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.headers["Content-Encoding"] == "gzip"
            text = gzip.decompress(resp.read()).decode()
        assert text == scrape(server.url)  # same exposition with and without compression
        # A name[] filter goes to prometheus-client's own app.
        query = "/metrics?name[]=rankwatch_build_info"
        with urllib.request.urlopen(server.url + query, timeout=10) as resp:
            filtered = parse_exposition(resp.read().decode())
        assert set(name for name, _ in filtered) == {"rankwatch_build_info"}
    finally:
        server.stop()


def test_openssl_certificate_works_too(tmp_path, free_port) -> None:
    """The fallback path of :func:`self_signed` (machines without the cryptography package)."""
    certfile, keyfile = _self_signed_openssl(tmp_path)
    server = MetricsServer(build_registry(_state()), port=free_port, tls=TLSConfig(certfile, keyfile)).start()
    try:
        text = scrape(server.url, context=ssl.create_default_context(cafile=certfile))
    finally:
        server.stop()
    assert "rankwatch_build_info" in text


def test_basic_auth_password_file(tmp_path) -> None:
    secret = tmp_path / "pass"
    secret.write_text("s3cret\n")
    auth = BasicAuth.from_file("prometheus", str(secret))
    assert auth.accepts(_basic("prometheus", "s3cret")["Authorization"])
    secret.write_text("\n")
    with pytest.raises(ValueError, match="empty password"):
        BasicAuth.from_file("prometheus", str(secret))
