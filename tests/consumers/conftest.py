"""A real single-node Kafka broker for the ``kafka`` tests (deploy/kafka/local.sh).

The broker runs on a free port for the whole session and is removed at the end (``local.sh clean``).
``RANKWATCH_TEST_KAFKA=host:port`` reuses an already running broker instead (nothing is stopped then;
the broker-restart test is skipped, since it cannot restart a broker it does not own).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from kafka_helpers import LOCAL_SH, ROOT, Broker, free_port_run, kill_started


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Broker]:
    external = os.environ.get("RANKWATCH_TEST_KAFKA")
    if external:
        yield Broker(external, None)
        return
    lib = ROOT / "deploy" / "kafka" / "lib"
    if not any(lib.glob("kafka_2.13-*.jar")):
        subprocess.run([str(LOCAL_SH), "fetch"], check=True, timeout=600)
    port = free_port_run(2)
    broker = Broker(f"127.0.0.1:{port}", port)
    try:
        broker.start()
    except subprocess.CalledProcessError as e:
        pytest.fail(f"local Kafka did not start: {e.stderr.decode(errors='replace')[-2000:]}")
    try:
        yield broker
    finally:
        broker._sh("clean")


@pytest.fixture
def unique() -> str:
    """A fresh name prefix for topics and groups, so tests never see each other's data."""
    return "t" + uuid.uuid4().hex[:10]




@pytest.fixture(autouse=True)
def _no_leftover_services() -> Iterator[None]:
    """Services a failed test left running are killed before the next test (and before the broker stops)."""
    yield
    kill_started()
