"""`python -m rankwatch ...`: the same command line as the installed `rankwatch` script.

For a virtualenv that is not activated (its `bin/` is not on PATH): `/path/to/venv/bin/python -m rankwatch`.
"""

from rankwatch.cli import entry

if __name__ == "__main__":
    entry()
