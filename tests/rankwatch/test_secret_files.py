"""Secrets out of the config file: the ``<key>_file`` convention, and no secret in any output or dump."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rankwatch.config import config_from_dict
from rankwatch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pa55-Very-Secret-7731"


def _security(tmp_path: Path, **keys: str) -> dict[str, object]:
    return {"kafka": {"security": {"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                                   "sasl_plain_username": "rankwatch", **keys}}}


def test_password_file_is_read_with_one_trailing_newline_stripped(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    cfg = config_from_dict(_security(tmp_path, sasl_plain_password_file="pw"), base=tmp_path)
    assert cfg.kafka.client_kwargs()["sasl_plain_password"] == PASSWORD
    (tmp_path / "pw2").write_text(PASSWORD + " \n\n")  # only one newline goes; the rest is the secret
    cfg = config_from_dict(_security(tmp_path, ssl_password_file="pw2"), base=tmp_path)
    assert cfg.kafka.client_kwargs()["ssl_password"] == PASSWORD + " \n"
    for dumped in (repr(cfg), str(cfg.kafka), repr(cfg.kafka.client_options)):
        assert PASSWORD not in dumped


@pytest.mark.parametrize(("keys", "needle"), [
    ({"sasl_plain_password": "x", "sasl_plain_password_file": "pw"}, "not both"),
    ({"sasl_plain_password_file": "missing"}, "no such file"),
    ({"sasl_plain_password_file": "empty"}, "is empty"),
])
def test_secret_file_problems_are_config_errors(tmp_path: Path, keys: dict[str, str], needle: str) -> None:
    (tmp_path / "pw").write_text(PASSWORD)
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=needle) as info:
        config_from_dict(_security(tmp_path, **keys), where="c.toml", base=tmp_path)
    assert "kafka.security.sasl_plain_password" in str(info.value) and PASSWORD not in str(info.value)


def test_a_known_password_appears_in_no_output(tmp_path: Path) -> None:
    """run and simulate against an address where nothing listens, with the password inline and in a file:
    the one error line, the log and --help never show it."""
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    outputs = []
    for key, value in (("sasl_plain_password_file", '"pw"'), ("sasl_plain_password", f'"{PASSWORD}"')):
        config = tmp_path / f"{key}.toml"
        config.write_text(f'[kafka]\nbootstrap_servers = ["127.0.0.1:1"]\nsession_timeout = "2s"\n'
                          f'[kafka.security]\nsecurity_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
                          f'sasl_plain_username = "u"\n{key} = {value}\n[exporter]\nenabled = false\n')
        for args in (["simulate", "--config", str(config), "--duration", "1s", "--fast"],
                     ["run", "--config", str(config), "--log-level", "debug", "--windows-out", str(tmp_path / "w")]):
            try:
                proc = subprocess.run([sys.executable, "-m", "rankwatch", *args], cwd=ROOT, capture_output=True, timeout=6)
                outputs.append(proc.stdout + proc.stderr)
            except subprocess.TimeoutExpired as e:  # run retries an unreachable broker: its output so far
                outputs.append((e.stdout or b"") + (e.stderr or b""))
    for cmd in ("run", "simulate"):
        outputs.append(subprocess.run([sys.executable, "-m", "rankwatch", cmd, "--help"], cwd=ROOT,
                                      capture_output=True, timeout=60).stdout)
    assert outputs and all(PASSWORD.encode() not in out for out in outputs)
    assert any(b"Kafka" in out for out in outputs)
