"""The command-line shell: one-line errors, no tracebacks, lazy subcommands."""

import subprocess
import sys

from rankwatch.cli import main


def test_unknown_command_is_one_line_and_nonzero(capsys):
    rc = main(["no-such-command"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1
    assert err.startswith("rankwatch: error:") and "no-such-command" in err


def test_version_exits_zero(capsys):
    assert main(["--version"]) == 0
    assert "rankwatch" in capsys.readouterr().out


def test_console_entry_point_has_no_traceback_on_bad_input():
    proc = subprocess.run(
        [sys.executable, "-m", "rankwatch.cli", "definitely-not-a-command"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
