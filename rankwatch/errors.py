"""The command line's errors, re-exported from the core (`rankwatch.pipeline.errors`) where they live."""

from rankwatch.pipeline.errors import ConfigError, RankwatchError

__all__ = ["ConfigError", "RankwatchError"]
