"""Helpers of the Kafka tests: the broker handle, run configs, starting and stopping ``rankwatch run``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SH = ROOT / "deploy" / "kafka" / "local.sh"


@dataclass
class Broker:
    bootstrap: str
    port: int | None  # None: an external broker we do not own

    def _sh(self, action: str) -> None:
        assert self.port is not None
        env = {**os.environ, "KAFKA_PORT": str(self.port), "KAFKA_CONTROLLER_PORT": str(self.port + 1)}
        subprocess.run([str(LOCAL_SH), action], check=True, env=env, capture_output=True, timeout=180)

    def stop(self) -> None:
        self._sh("stop")

    def start(self) -> None:
        self._sh("start")


def free_port_run(count: int) -> int:
    """A free port p with p + 1, ..., p + count - 1 free as well: a local service's listeners side by side
    (Kafka's broker and controller, + SASL_SSL; the registry's HTTP and management ports)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + count - 1 > 65535:
            continue
        try:
            for extra in range(1, count):
                with socket.socket() as s2:
                    s2.bind(("127.0.0.1", port + extra))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no {count} free consecutive ports")


def write_config(path: Path, *, bootstrap: str, prefix: str, windows: tuple[str, ...] = ("1m", "5m"),
                 attribution: str = "1m", disorder: str = "5s", checkpoint_interval: str = "1s",
                 kafka_extra: str = "", extra: str = "") -> Path:
    """A run config for tests: idle timeout of an hour, so only events (and closers) move watermarks."""
    sizes = ", ".join(f'"{w}"' for w in windows)
    path.write_text(f"""
[kafka]
bootstrap_servers = ["{bootstrap}"]
group_id = "{prefix}-group"
checkpoint_interval = "{checkpoint_interval}"
session_timeout = "6s"
max_poll_records = 500
{kafka_extra}
[topics]
impressions = "{prefix}-imp"
clicks = "{prefix}-clk"
[windows]
sizes = [{sizes}]
attribution = "{attribution}"
allowed_disorder = "{disorder}"
idle_timeout = "1h"
[exporter]
enabled = false
{extra}
""")
    return path


STARTED: list[subprocess.Popen[bytes]] = []  # killed at the end of each test (see conftest)


def start_run(config: Path, windows_out: Path, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rankwatch.cli", "run", "--config", str(config), "--windows-out", str(windows_out)],
        cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT,
    )
    STARTED.append(proc)
    return proc


def kill_started() -> None:
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def stop_run(proc: subprocess.Popen[bytes], *, kill: bool = False, timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    return proc.wait(timeout=timeout)


def wait_for(predicate: Callable[[], Any], *, timeout: float, what: str, procs: tuple[Any, ...] = (),
             log: Path | None = None) -> Any:
    """Poll ``predicate`` until it is truthy; fail after ``timeout`` s or when a process in ``procs`` exits.

    ``log``: a service log whose tail the failure message carries (what the service was doing).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"service exited with {p.returncode} while waiting for {what}{_tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{_tail(log)}")
        time.sleep(0.2)


def _tail(log: Path | None, chars: int = 4000) -> str:
    if log is None or not log.exists():
        return ""
    return "\n--- service log (tail) ---\n" + log.read_text(errors="replace")[-chars:]


def past_first_close(events: Any, *, window_ms: int = 60_000, attribution_ms: int = 60_000,
                     disorder_ms: int = 5_000, margin_ms: int = 15_000) -> int:
    """Where to split ``events`` so that the first part closes a window (write_config's defaults).

    The index of the first event ``margin_ms`` of event time past the moment the first aligned window can
    close (its end + the attribution window + the allowed disorder). Splitting at half the events instead
    makes "wait for the first window" depend on the second of the minute the traffic starts at.
    """
    first_close = (min(e.ts_ms for e in events) // window_ms + 1) * window_ms + attribution_ms + disorder_ms
    split = next((i for i, e in enumerate(events) if e.ts_ms >= first_close + margin_ms), None)
    assert split is not None and split < len(events) - 100, "too little traffic to close a window in the first part"
    return split


def produce_to(bootstrap: str, prefix: str, events: list[Any]) -> None:
    """``events`` to the ``<prefix>-imp`` / ``<prefix>-clk`` topics, in order, as one producer in a burst
    (batches of up to 256 KiB, 20 ms linger, every record acknowledged by the broker)."""
    from kafka import KafkaProducer

    from rankwatch.consumers.producer import produce_events

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024)
    try:
        produce_events(producer, events, topics={"impressions": f"{prefix}-imp", "clicks": f"{prefix}-clk"})
    finally:
        producer.close()


CONSUMING = "consuming partition pairs"


def consuming_count(log: Path) -> int:
    """How many times services logging to ``log`` got a non-empty set of partition pairs assigned."""
    return log.read_text(errors="replace").count(CONSUMING + " [") - log.read_text(errors="replace").count(
        CONSUMING + " []") if log.exists() else 0


def wait_consuming(log: Path, before: int, *, procs: tuple[Any, ...], timeout: float = 120) -> None:
    """Wait until a service logging to ``log`` got an assignment after ``before`` were counted."""
    wait_for(lambda: consuming_count(log) > before, timeout=timeout, what="an assignment", procs=procs, log=log)
