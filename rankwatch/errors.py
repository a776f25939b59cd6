"""Errors that the command line turns into one line and a non-zero exit."""


class RankwatchError(Exception):
    """Bad input or configuration: shown to the user as one line, exit status 1 (2 for usage)."""

    exit_code = 1


class ConfigError(RankwatchError):
    """A configuration file or option is wrong; the message names the key."""

    exit_code = 2
