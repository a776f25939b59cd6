"""Which CRC-32C function kafka-python verifies record batches with (C or pure Python).

kafka-python checks the CRC-32C of every v2 record batch it fetches (``check_crcs=True``, never turned
off by rankwatch). ``kafka/record/util.py`` binds ``crc32c.crc32c`` (the C extension of the ``crc32c``
package, a runtime dependency) when it can import it, else a pure-Python table loop that costs about
85 % of the consume time (docs/benchmarks.md). ``calc_crc32c`` takes the bound function as its default
argument, which is what :func:`bound_crc32c` reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any


def bound_crc32c() -> Callable[[Any], int]:
    """The CRC-32C function kafka-python's record batches are verified with in this process."""
    from kafka.record import util

    defaults = util.calc_crc32c.__defaults__ or ()
    return defaults[0] if defaults else util.calc_crc32c  # type: ignore[no-any-return]


def crc32c_is_c() -> bool:
    """True when kafka-python verifies CRCs with the ``crc32c`` C extension."""
    try:
        from crc32c import crc32c as c_crc32c
    except ImportError:
        return False
    return bound_crc32c() is c_crc32c


def log_crc32c(logger: logging.Logger) -> bool:
    """Log once which CRC-32C kafka-python uses: INFO for C, WARNING (with the fix) for pure Python."""
    if crc32c_is_c():
        logger.info("kafka-python verifies record CRCs with the crc32c C extension")
        return True
    logger.warning("kafka-python verifies record CRCs in pure Python (about 7x slower consumption): "
                   "install crc32c (pip install 'crc32c>=2.3')")
    return False
