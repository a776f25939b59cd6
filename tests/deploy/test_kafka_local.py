"""deploy/kafka/local.sh: fetch is idempotent, start/stop/status are idempotent and honest about state."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.consumers.kafka_helpers import free_port_run

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SH = ROOT / "deploy" / "kafka" / "local.sh"


def _sh(*args: str, port: int | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if port is not None:
        env.update(KAFKA_PORT=str(port), KAFKA_CONTROLLER_PORT=str(port + 1))
    return subprocess.run([str(LOCAL_SH), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_usage_and_status_of_a_stopped_broker() -> None:
    bad = _sh("bogus")
    assert bad.returncode == 2 and "usage" in bad.stderr
    port = free_port_run(2)
    status = _sh("status", port=port)
    assert status.returncode == 3 and "stopped" in status.stdout
    assert _sh("stop", port=port).returncode == 0  # stopping a stopped broker is fine


@pytest.mark.kafka
def test_fetch_start_stop_are_idempotent_and_the_broker_serves_clients() -> None:
    first = _sh("fetch", timeout=600)
    assert first.returncode == 0, first.stderr
    started = time.monotonic()
    again = _sh("fetch")
    assert again.returncode == 0 and "present" in again.stdout and time.monotonic() - started < 5
    port = free_port_run(2)
    try:
        up = _sh("start", port=port)
        assert up.returncode == 0, up.stderr
        assert f"running on 127.0.0.1:{port}" in up.stdout
        assert "already running" in _sh("start", port=port).stdout
        assert _sh("status", port=port).returncode == 0
        # It is a real broker: a client creates a topic, produces and reads a record back.
        from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
        from kafka.admin import NewTopic

        boot = f"127.0.0.1:{port}"
        admin = KafkaAdminClient(bootstrap_servers=boot)
        admin.create_topics([NewTopic("local-sh-check", 1, 1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=boot)
        producer.send("local-sh-check", b"hello").get(timeout=30)
        producer.close()
        consumer = KafkaConsumer("local-sh-check", bootstrap_servers=boot, auto_offset_reset="earliest",
                                 consumer_timeout_ms=10_000)
        assert [r.value for r in consumer] == [b"hello"]
        consumer.close()
        assert (ROOT / "deploy" / "kafka" / "run" / str(port) / "server.log").stat().st_size > 0
        down = _sh("stop", port=port)
        assert down.returncode == 0 and "stopped" in down.stdout
        assert _sh("status", port=port).returncode == 3
    finally:
        _sh("clean", port=port)


def _env_for(port: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(KAFKA_PORT=str(port), KAFKA_CONTROLLER_PORT=str(port + 1), **extra)
    return env


def test_no_script_step_needs_python() -> None:
    # Readiness and cluster ids come from bash and Kafka's own tools, so the script works from any shell,
    # whatever python3 is on PATH (a system Python without kafka-python, a venv that is not activated).
    text = LOCAL_SH.read_text(encoding="utf-8")
    code_lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code_lines if "python" in ln]


@pytest.mark.kafka
def test_a_cluster_id_starting_with_a_dash_formats_and_a_broken_python3_does_not_matter(tmp_path: Path) -> None:
    # One random base64url id in 64 starts with '-', which Kafka's StorageTool read as an option. The id is
    # now passed as --cluster-id=ID; force such an id, and put a python3 that always fails first on PATH.
    assert _sh("fetch", timeout=600).returncode == 0
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake_python = fake_bin / "python3"
    fake_python.write_text("#!/bin/sh\necho 'not this python' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    port = free_port_run(2)
    env = _env_for(port, KAFKA_CLUSTER_ID="-AAAAAAAAAAAAAAAAAAAAA", PATH=f"{fake_bin}:{os.environ['PATH']}")
    try:
        up = subprocess.run([str(LOCAL_SH), "start"], env=env, capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stderr
        meta = (ROOT / "deploy" / "kafka" / "run" / str(port) / "data" / "meta.properties").read_text()
        assert "cluster.id=-AAAAAAAAAAAAAAAAAAAAA" in meta
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}")
        assert isinstance(admin.list_topics(), list)
        admin.close()
    finally:
        _sh("clean", port=port)


@pytest.mark.kafka
def test_fresh_cluster_ids_never_start_with_a_dash() -> None:
    # Kafka's own generator regenerates ids with a leading '-'; sample it through the script's code path.
    assert _sh("fetch", timeout=600).returncode == 0
    lib = ROOT / "deploy" / "kafka" / "lib"
    out = subprocess.run(
        ["bash", "-c", f'for i in $(seq 8); do java -cp "{lib}/*" kafka.tools.StorageTool random-uuid; done'],
        capture_output=True, text=True, timeout=180,
    )
    ids = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    assert len(ids) == 8 and all(len(i) == 22 and not i.startswith("-") for i in ids)
