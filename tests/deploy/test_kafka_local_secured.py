"""deploy/kafka/local.sh with KAFKA_SECURITY=sasl_ssl: SCRAM-SHA-512 over TLS, ACLs, and how each refusal looks.

One secured broker on free ports serves the whole module (``local.sh clean`` at the end). The clients are
kafka-python's, configured as an application would be (docs/security.md); every wait polls to a deadline and
every client call is bounded.
"""

from __future__ import annotations

import logging
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.consumers.kafka_helpers import start_run, stop_run, wait_for, write_config
from tests.consumers.secured_broker import BOOTSTRAP_TIMEOUT_MS, USERS, secured_broker
from tests.consumers.secured_broker import SecuredBroker as Secured

pytestmark = pytest.mark.kafka

@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    with secured_broker() as broker:
        yield broker


def _unique() -> str:
    return "s" + uuid.uuid4().hex[:10]


def _create_topics(broker: Secured, *names: str, partitions: int = 1) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(**broker.client("admin"))
    try:
        admin.create_topics([NewTopic(n, partitions, 1) for n in names], timeout_ms=15_000)
        wait_for(lambda: set(names) <= set(admin.list_topics()), timeout=30, what=f"topics {names}")
    finally:
        admin.close()


def test_secured_start_writes_the_client_files_and_keeps_its_mode(secured: Secured) -> None:
    up = secured.sh("start")
    assert up.returncode == 0 and "already running" in up.stdout
    status = secured.sh("status")
    assert status.returncode == 0 and f"SASL_SSL on 127.0.0.1:{secured.sasl_port}" in status.stdout
    for user in USERS:
        path = secured.client_dir / f"{user}.password"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(secured.password(user)) == 32
    assert stat.S_IMODE((secured.client_dir / "admin.properties").stat().st_mode) == 0o600
    assert (secured.client_dir / "ca.pem").read_text().startswith("-----BEGIN CERTIFICATE-----")
    props = (secured.client_dir / "client.properties").read_text()
    assert f"bootstrap.servers=127.0.0.1:{secured.sasl_port}" in props and "sasl.mechanism=SCRAM-SHA-512" in props
    assert secured.password("rankwatch") not in props  # passwords only in the files of mode 600 (and admin's)
    readme = (secured.client_dir / "README").read_text()
    assert all(user in readme for user in USERS)
    # A secured run folder never comes back open (nor the other way round) without `clean`.
    refused = secured.sh("start", KAFKA_SECURITY="plaintext")
    assert refused.returncode == 1 and "formatted as sasl_ssl" in refused.stderr
    assert secured.sh("acls", "only-a-group").returncode == 2


def test_rankwatch_with_the_granted_acls_produces_and_consumes_in_its_group(secured: Secured) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import NewTopic

    group = _unique()
    inp, clk = f"{group}-imp", f"{group}-clk"
    _create_topics(secured, inp, clk)
    grant = secured.sh("acls", group, inp, clk)
    assert grant.returncode == 0, grant.stderr
    assert f"name={group}., patternType=PREFIXED" in grant.stdout

    producer = KafkaProducer(**secured.client("admin"))
    producer.send(inp, b"event").get(timeout=30)
    producer.close(timeout=10)
    consumer = KafkaConsumer(inp, **secured.client("rankwatch"), group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=20_000)
    try:
        got = wait_for(lambda: [r.value for rs in consumer.poll(timeout_ms=1000).values() for r in rs],
                       timeout=30, what="the input record")
        assert got == [b"event"]
        consumer.commit()
        assert consumer.committed(TopicPartition(inp, 0)) == 1
    finally:
        consumer.close()

    # Its own topics (prefix "<group>."): created, written and read back by the rankwatch user itself.
    own = f"{group}.checkpoints"
    admin = KafkaAdminClient(**secured.client("rankwatch"))
    try:
        admin.create_topics([NewTopic(own, 1, 1)], timeout_ms=15_000)
    finally:
        admin.close()
    producer = KafkaProducer(**secured.client("rankwatch"))  # idempotent by default: no IdempotentWrite ACL
    producer.send(own, b"chunk").get(timeout=30)
    producer.close(timeout=10)
    reader = KafkaConsumer(**secured.client("rankwatch"), enable_auto_commit=False)
    try:
        reader.assign([TopicPartition(own, 0)])
        reader.seek_to_beginning()
        got = wait_for(lambda: [r.value for rs in reader.poll(timeout_ms=1000).values() for r in rs],
                       timeout=30, what="the checkpoint record")
        assert got == [b"chunk"]
    finally:
        reader.close()


def test_rankwatch_run_needs_no_more_than_the_granted_acls(secured: Secured, tmp_path: Path) -> None:
    # The real service as User:rankwatch: it creates <group>.checkpoints and <group>.dead-letters, joins the
    # group, commits and checkpoints, with only what `local.sh acls` grants (docs/security.md).
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    prefix = _unique()
    group = f"{prefix}-group"
    _create_topics(secured, f"{prefix}-imp", f"{prefix}-clk", partitions=2)
    assert secured.sh("acls", group, f"{prefix}-imp", f"{prefix}-clk").returncode == 0
    producer = KafkaProducer(**secured.client("admin"))
    producer.send(f"{prefix}-imp", b"not json", partition=0).get(timeout=30)  # becomes a dead letter
    producer.close(timeout=10)
    security = ", ".join(f'{k} = "{v}"' for k, v in secured.client("rankwatch").items()
                         if k not in ("bootstrap_servers", "bootstrap_timeout_ms", "request_timeout_ms"))
    config = write_config(tmp_path / "run.toml", bootstrap=f"127.0.0.1:{secured.sasl_port}", prefix=prefix,
                          kafka_extra=f"security = {{ {security} }}")
    log = tmp_path / "run.log"
    proc = start_run(config, tmp_path / "windows.jsonl", log)
    try:
        dead = KafkaConsumer(**secured.client("admin"), enable_auto_commit=False)
        try:
            wait_for(lambda: f"{group}.dead-letters" in dead.topics(), timeout=60,
                     what="the dead-letter topic, created by the rankwatch user", procs=(proc,))
            dead.assign([TopicPartition(f"{group}.dead-letters", 0)])
            dead.seek_to_beginning()
            wait_for(lambda: dead.poll(timeout_ms=1000), timeout=60, what="the dead letter", procs=(proc,))
        finally:
            dead.close()
        assert "consuming partition pairs [0, 1]" in log.read_text()
    finally:
        rc = stop_run(proc, timeout=60)
    assert rc == 0, log.read_text()[-3000:]


def test_a_wrong_password_is_a_bootstrap_timeout_whose_cause_only_the_broker_log_names(
    secured: Secured, caplog: pytest.LogCaptureFixture,
) -> None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError

    caplog.set_level(logging.WARNING, logger="kafka")
    server_log = secured.client_dir.parent / "server.log"
    before = server_log.read_text(errors="replace").count("invalid credentials with SASL mechanism SCRAM-SHA-512")
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaAdminClient(**secured.client("rankwatch", password="not-the-password"))
    elapsed = time.monotonic() - started
    # The constructor waits out bootstrap_timeout_ms (default 30 s), retrying with backoff.
    assert BOOTSTRAP_TIMEOUT_MS / 1000 - 0.5 <= elapsed < BOOTSTRAP_TIMEOUT_MS / 1000 + 10
    # kafka-python logs each attempt as "Bootstrap connection to bootstrap-0 failed: ..." with either
    # SaslAuthenticationFailedError (invalid credentials) or, as often, just "socket disconnected": the broker
    # closes right after its error response and the client may see the close first; on a busy machine an
    # attempt may also time out (its request timeout shrinks with the time left: "timed out", or a
    # KafkaTimeoutError "Timeout during ApiVersions check", seen once with a core kept busy). The broker always
    # says why.
    failures = [r.getMessage() for r in caplog.records if "Bootstrap connection to" in r.getMessage()]
    assert failures and all(any(cause in m for cause in ("SaslAuthenticationFailedError", "socket disconnected",
                                                          "timed out", "KafkaTimeoutError")) for m in failures), failures
    wait_for(lambda: server_log.read_text(errors="replace").count(
        "invalid credentials with SASL mechanism SCRAM-SHA-512") > before, timeout=10, what="the broker's log line")


def test_intruder_is_denied_the_topic_and_the_group(secured: Secured) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError

    topic = _unique()
    _create_topics(secured, topic)
    producer = KafkaProducer(**secured.client("intruder"), max_block_ms=15_000)
    try:
        started = time.monotonic()
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(topic, b"x").get(timeout=30)
        assert time.monotonic() - started < 15
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(topic, **secured.client("intruder"), group_id=_unique(), enable_auto_commit=False)
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=1000)
    finally:
        consumer.close()


def test_a_ca_that_did_not_sign_the_broker_fails_the_tls_handshake(
    secured: Secured, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaTimeoutError

    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=other",
                    "-keyout", str(tmp_path / "other.key"), "-out", str(other_ca)],
                   check=True, capture_output=True, timeout=60)
    caplog.set_level(logging.WARNING, logger="kafka")
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaAdminClient(**secured.client("admin", cafile=other_ca))
    assert time.monotonic() - started < BOOTSTRAP_TIMEOUT_MS / 1000 + 10
    assert any("CERTIFICATE_VERIFY_FAILED" in r.getMessage() for r in caplog.records)
