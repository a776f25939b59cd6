"""rankwatch against a secured broker (SASL_SSL, SCRAM-SHA-512, StandardAuthorizer; deploy/kafka/local.sh with
KAFKA_SECURITY=sasl_ssl), with exactly the ACLs of docs/security.md: same windows as the oracle, effectively once
over SIGKILL, and every bad credential or missing ACL one line and a non-zero exit. One broker for the module.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
)
from kafka.admin import ResourceType as RT
from kafka_helpers import (
    ROOT,
    consuming_count,
    kill_started,
    start_run,
    stop_run,
    wait_consuming,
    wait_for,
    write_config,
)
from kafka_oracle import assert_documents_equal, expected_windows, read_truth
from secured_broker import SecuredBroker as Secured
from secured_broker import secured_broker

from rankwatch.consumers.windows_out import document_identity, read_windows

pytestmark = pytest.mark.kafka
WINDOWS = ("1m", "5m")
SESSION_S = 6.0  # write_config's session_timeout


@pytest.fixture(scope="module")
def secured() -> Iterator[Secured]:
    try:
        with secured_broker() as broker:
            try:
                yield broker
            finally:
                kill_started()
    except RuntimeError as e:  # local.sh start failed: its stderr is the message
        pytest.fail(str(e))


def rankwatch_acls(group: str, topics: tuple[str, ...], user: str = "rankwatch") -> list[ACL]:
    """Exactly the ACLs of docs/security.md (the same as `local.sh acls GROUP TOPIC...`)."""
    p, allow = f"User:{user}", ACLPermissionType.ALLOW
    out = [ACL(p, "*", op, allow, ResourcePattern(RT.TOPIC, t)) for t in topics for op in (ACLOperation.READ, ACLOperation.DESCRIBE)]
    out.append(ACL(p, "*", ACLOperation.READ, allow, ResourcePattern(RT.GROUP, group)))
    out += [ACL(p, "*", op, allow, ResourcePattern(RT.TOPIC, f"{group}.", ACLResourcePatternType.PREFIXED))
            for op in (ACLOperation.CREATE, ACLOperation.DESCRIBE, ACLOperation.READ, ACLOperation.WRITE)]
    return out


def grant(broker: Secured, acls: list[ACL]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.plain)
    try:
        result = admin.create_acls(acls)
        assert not result["failed"], result["failed"]
    finally:
        admin.close()


def revoke(broker: Secured, acls: list[ACL]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.plain)
    try:
        admin.delete_acls([ACLFilter(a.principal, a.host, a.operation, a.permission_type, a.resource_pattern) for a in acls])
    finally:
        admin.close()


def simulate(broker: Secured, tmp_path: Path, prefix: str, *extra: str) -> int:
    """`rankwatch simulate --config` as the admin user over SASL_SSL."""
    config = write_config(tmp_path / "admin.toml", bootstrap=broker.sasl, prefix=prefix,
                          kafka_extra=broker.security("admin"))
    proc = subprocess.run([sys.executable, "-m", "rankwatch", "simulate", "--config", str(config), "--fast",
                           "--create-topics", "--partitions", "2", "--close-windows", "2h", *extra],
                          cwd=ROOT, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return proc.returncode


def run_until_exit(config: Path, tmp_path: Path, *, within: float) -> tuple[int, str]:
    """`rankwatch run`, expected to exit by itself within ``within`` s (polled, then killed and failed)."""
    log = tmp_path / "run.log"
    proc = start_run(config, tmp_path / "windows.jsonl", log)
    deadline = time.monotonic() + within
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)
        raise AssertionError(f"rankwatch run still running {within:.0f} s after start: {log.read_text()[-1500:]}")
    return proc.returncode, log.read_text(errors="replace")


def _windows(*paths: Path) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for path in paths:
        if path.exists():
            for doc in read_windows(path):
                ident = document_identity(doc)
                if ident in out:
                    assert_documents_equal(doc, out[ident], context=f"republished {ident}")
                out[ident] = doc
    return out


def _assert_one_line(output: str, *needles: str, secrets: tuple[str, ...] = ()) -> None:
    errors = [ln for ln in output.splitlines() if ln.startswith("rankwatch: error:")]
    assert len(errors) == 1, output[-2000:]
    assert all(n in errors[0] for n in needles), errors[0]
    assert "Traceback" not in output
    for secret in secrets:
        assert secret not in output


def test_run_with_least_privilege_acls_gives_the_oracle_windows_and_survives_sigkill(
    secured: Secured, unique: str, tmp_path: Path
) -> None:
    truth = tmp_path / "truth.jsonl"
    imp, clk = f"{unique}-imp", f"{unique}-clk"
    simulate(secured, tmp_path, unique, "--rate", "8", "--duration", "3m", "--seed", "5", "--items-per-request", "8",
             "--attribution-window", "1m", "--malformed-rate", "0.02", "--ground-truth", str(truth))
    grant(secured, rankwatch_acls(f"{unique}-group", (imp, clk)))
    want = expected_windows(read_truth(truth), windows=WINDOWS, partitions=2)
    config = write_config(tmp_path / "run.toml", bootstrap=secured.sasl, prefix=unique, checkpoint_interval="300ms",
                          kafka_extra=f'instance_id = "{unique}-a"' + secured.security())
    log = tmp_path / "run.log"
    first = start_run(config, tmp_path / "w0.jsonl", log)
    wait_consuming(log, 0, procs=(first,))
    wait_for(lambda: len(_windows(tmp_path / "w0.jsonl")) >= 3, timeout=180, what="the first windows", procs=(first,),
             log=log)
    stop_run(first, kill=True)
    before = consuming_count(log)
    second = start_run(config, tmp_path / "w1.jsonl", log)
    try:
        # The second instance takes over (restoring the first one's last checkpoints) before the windows are
        # checked: the first one may have published them all already, and stopping a process still starting
        # would test nothing.
        wait_consuming(log, before, procs=(second,))
        wait_for(lambda: set(want) <= set(_windows(tmp_path / "w0.jsonl", tmp_path / "w1.jsonl")), timeout=120,
                 what="every window of the traffic", procs=(second,))
    finally:
        assert stop_run(second) == 0, log.read_text()[-3000:]
    got = _windows(tmp_path / "w0.jsonl", tmp_path / "w1.jsonl")
    for ident, doc in want.items():
        assert_documents_equal(got[ident], doc, context=str(ident))
    assert secured.password("rankwatch") not in log.read_text(errors="replace")


@pytest.mark.parametrize("case", ["wrong-password", "unknown-user", "ca-mismatch"])
def test_bad_credentials_end_run_with_one_line(secured: Secured, unique: str, tmp_path: Path, case: str) -> None:
    user, pw, ca = "rankwatch", None, None
    if case == "wrong-password":
        pw = tmp_path / "pw"
        pw.write_text("not-the-password\n")
    elif case == "unknown-user":
        user = "nobody"
        pw = secured.client_dir / "rankwatch.password"
    else:
        ca = tmp_path / "other-ca.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(tmp_path / "k"),
                        "-out", str(ca), "-subj", "/CN=other", "-days", "1"], check=True, capture_output=True)
    config = write_config(tmp_path / "run.toml", bootstrap=secured.sasl, prefix=unique,
                          kafka_extra=secured.security(user, password_file=pw, cafile=ca))
    rc, out = run_until_exit(config, tmp_path, within=SESSION_S + 20)
    assert rc != 0
    if case == "ca-mismatch":
        _assert_one_line(out, "TLS handshake", secured.sasl, "ssl_cafile")
    else:
        _assert_one_line(out, "authentication failed", f"user {user!r}", secured.sasl, "SCRAM-SHA-512",
                         secrets=(secured.password("rankwatch"), "not-the-password"))


@pytest.mark.parametrize("missing", ["input-topic", "group", "own-topics"])
def test_a_missing_acl_ends_run_with_one_line_naming_it(secured: Secured, unique: str, tmp_path: Path, missing: str) -> None:
    imp, clk, group = f"{unique}-imp", f"{unique}-clk", f"{unique}-group"
    admin = KafkaAdminClient(bootstrap_servers=secured.plain)
    try:
        admin.create_topics({imp: {"num_partitions": 2, "replication_factor": 1},
                             clk: {"num_partitions": 2, "replication_factor": 1}})
    finally:
        admin.close()
    acls = rankwatch_acls(group, (imp, clk))
    drop = {"input-topic": lambda a: a.resource_pattern.resource_name == clk,
            "group": lambda a: a.resource_pattern.resource_type == RT.GROUP,
            "own-topics": lambda a: a.resource_pattern.pattern_type == ACLResourcePatternType.PREFIXED}[missing]
    grant(secured, [a for a in acls if not drop(a)])
    config = write_config(tmp_path / "run.toml", bootstrap=secured.sasl, prefix=unique, kafka_extra=secured.security())
    rc, out = run_until_exit(config, tmp_path, within=SESSION_S + 30)
    assert rc != 0
    resource = {"input-topic": f"topic '{clk}'", "group": f"group '{group}'", "own-topics": f"topic '{group}."}[missing]
    _assert_one_line(out, "authorization failed", "user 'rankwatch'", resource, secrets=(secured.password("rankwatch"),))


def test_acl_revoked_mid_run_exits_without_partial_windows_and_a_restart_loses_nothing(
    secured: Secured, unique: str, tmp_path: Path
) -> None:
    truth = tmp_path / "truth.jsonl"
    imp, clk, group = f"{unique}-imp", f"{unique}-clk", f"{unique}-group"
    simulate(secured, tmp_path, unique, "--rate", "6", "--duration", "2m", "--seed", "9", "--items-per-request", "6",
             "--attribution-window", "1m", "--ground-truth", str(truth))
    want = expected_windows(read_truth(truth), windows=WINDOWS, partitions=2)
    acls = rankwatch_acls(group, (imp, clk))
    read_clicks = [a for a in acls if a.resource_pattern.resource_name == clk and a.operation == ACLOperation.READ]
    grant(secured, [a for a in acls if a not in read_clicks])  # clicks can be described, not read
    config = write_config(tmp_path / "run.toml", bootstrap=secured.sasl, prefix=unique, kafka_extra=secured.security())
    rc, out = run_until_exit(config, tmp_path, within=SESSION_S + 40)
    assert rc != 0
    _assert_one_line(out, "authorization failed", f"topic '{clk}'")
    partial = _windows(tmp_path / "windows.jsonl")
    assert not (set(partial) & set(want)), "a window was published from impressions without their clicks"
    grant(secured, read_clicks)
    log = tmp_path / "again.log"
    proc = start_run(config, tmp_path / "w1.jsonl", log)
    try:
        wait_for(lambda: set(want) <= set(_windows(tmp_path / "w1.jsonl")), timeout=120,
                 what="every window after the ACL came back", procs=(proc,))
    finally:
        assert stop_run(proc) == 0, log.read_text()[-3000:]
    got = _windows(tmp_path / "w1.jsonl")
    for ident, doc in want.items():
        assert_documents_equal(got[ident], doc, context=str(ident))


def test_unreachable_broker_sigterm_ends_run_within_shutdown_timeout_and_no_thread_piles_up(
    unique: str, tmp_path: Path
) -> None:
    """A listener that accepts and never answers (the worst case: every wait runs to its bound)."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    config = write_config(tmp_path / "run.toml", bootstrap=f"127.0.0.1:{silent.getsockname()[1]}", prefix=unique,
                          kafka_extra='shutdown_timeout = "5s"\nretry_backoff_max = "1s"')
    log = tmp_path / "run.log"
    proc = subprocess.Popen([sys.executable, "-m", "rankwatch", "run", "--config", str(config), "--log-level", "debug"],
                            cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        attempts = wait_for(lambda: [int(ln.rsplit(";", 1)[1].split()[0]) for ln in log.read_text(errors="replace").splitlines()
                                     if "start attempt failed;" in ln][3:] or None,
                            timeout=90, what="four failed start attempts", procs=(proc,))
        first = [int(ln.rsplit(";", 1)[1].split()[0]) for ln in log.read_text(errors="replace").splitlines()
                 if "start attempt failed;" in ln][0]
        assert max(attempts) <= first, f"threads after each failed attempt grew: {first} -> {attempts}"
        time.sleep(3.5)  # somewhere inside the next attempt's bounded wait (7 s)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5 + 5  # shutdown_timeout + margin
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is not None, "still running 10 s after SIGTERM (shutdown_timeout 5 s)"
        assert proc.returncode == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        silent.close()
