"""``rankwatch simulate``: bad arguments are one line (the Kafka side is in tests/consumers/test_cli_kafka.py)."""

from __future__ import annotations

import pytest

from rankwatch.cli import main


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--malformed-rate", "2"], "--malformed-rate"),
        (["--duration", "ten minutes"], "--duration"),
        (["--regression-from", "soon"], "--regression-from"),
        (["--start", "2026-11-30T10:00:00"], "needs a zone"),
        (["--rate", "0"], "--rate"),
    ],
)
def test_bad_arguments_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    assert main(["simulate", *args]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rankwatch: error: "), err
    assert needle in err


def test_unreachable_broker_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--bootstrap-servers", "127.0.0.1:1", "--fast", "--duration", "1s"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "127.0.0.1:1" in err
