"""Errors that the command line turns into one line and a non-zero exit.

They live in the core so that every layer (core, Kafka, exporter, application) can raise them while
imports keep pointing down; `rankwatch.errors` re-exports them for the application layer.
"""


class RankwatchError(Exception):
    """Bad input or configuration: shown to the user as one line, exit status 1 (2 for usage)."""

    exit_code = 1


class ConfigError(RankwatchError):
    """A configuration file or option is wrong; the message names the key."""

    exit_code = 2
