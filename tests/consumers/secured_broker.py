"""The secured broker of the security tests: deploy/kafka/local.sh with ``KAFKA_SECURITY=sasl_ssl`` on free ports.

:func:`secured_broker` starts one (SCRAM-SHA-512 over TLS on ``port + 2``, the plaintext listener on ``port``
for the test's own admin work, the controller on ``port + 1``) and removes its run folder at the end;
:class:`SecuredBroker` hands out what a client needs: kafka-python options, a rankwatch ``[kafka.security]``
table, the users' passwords. tests/consumers/test_security_kafka.py (rankwatch against it) and
tests/deploy/test_kafka_local_secured.py (the script itself) share it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.consumers.kafka_helpers import free_port_run

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SH = ROOT / "deploy" / "kafka" / "local.sh"
USERS = ("admin", "rankwatch", "intruder")  # the SCRAM users local.sh creates
BOOTSTRAP_TIMEOUT_MS = 5000  # a refused connection never bootstraps: bound the constructors' wait


@dataclass
class SecuredBroker:
    port: int

    @property
    def sasl_port(self) -> int:
        return self.port + 2

    @property
    def plain(self) -> str:
        """The plaintext listener: User:ANONYMOUS, a super user (the test's admin for ACLs and topics)."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def client_dir(self) -> Path:
        """Where local.sh writes the CA, the password files and client.properties."""
        return ROOT / "deploy" / "kafka" / "run" / str(self.port) / "client"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KAFKA_PORT": str(self.port), "KAFKA_CONTROLLER_PORT": str(self.port + 1),
                "KAFKA_SASL_PORT": str(self.sasl_port), "KAFKA_SECURITY": "sasl_ssl"}

    def sh(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """``local.sh ARGS`` for this broker (``env`` overrides), its exit status left to the caller."""
        return subprocess.run([str(LOCAL_SH), *args], env={**self.env, **env}, capture_output=True, text=True,
                              timeout=180)

    def password(self, user: str) -> str:
        return (self.client_dir / f"{user}.password").read_text().strip()

    def client(self, user: str, *, password: str | None = None, cafile: Path | None = None) -> dict[str, Any]:
        """kafka-python options of ``user`` on the SASL_SSL listener."""
        return {
            "bootstrap_servers": self.sasl,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": user,
            "sasl_plain_password": self.password(user) if password is None else password,
            "ssl_cafile": str(cafile or self.client_dir / "ca.pem"),
            "bootstrap_timeout_ms": BOOTSTRAP_TIMEOUT_MS,
            "request_timeout_ms": 15_000,
        }

    def security(self, user: str = "rankwatch", *, password_file: Path | None = None,
                 cafile: Path | None = None) -> str:
        """rankwatch's ``[kafka.security]`` table for ``user`` (the password read from its file)."""
        return (f'\n[kafka.security]\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\n'
                f'sasl_plain_username = "{user}"\n'
                f'sasl_plain_password_file = "{password_file or self.client_dir / (user + ".password")}"\n'
                f'ssl_cafile = "{cafile or self.client_dir / "ca.pem"}"\n')


@contextmanager
def secured_broker() -> Iterator[SecuredBroker]:
    """A started secured broker (the jars fetched first when absent); its run folder removed at the end."""
    if not any((ROOT / "deploy" / "kafka" / "lib").glob("kafka_2.13-*.jar")):
        subprocess.run([str(LOCAL_SH), "fetch"], check=True, timeout=600)
    broker = SecuredBroker(free_port_run(3))  # plaintext, controller, SASL_SSL
    try:
        up = broker.sh("start")
        if up.returncode != 0:
            raise RuntimeError(f"secured local Kafka did not start: {up.stderr[-2000:]}")
        yield broker
    finally:
        broker.sh("clean")
