"""Suite-wide policy: ``slow`` tests run only on request (``RANKWATCH_SLOW=1`` or ``-m slow``).

The Kafka robustness loops are not marked ``slow``: CI runs one round of each (and the backlog on 20,000
requests); ``RANKWATCH_SLOW=1 python -m pytest`` runs them at full length (5 rounds, 100,000 requests).
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` tests run only with ``RANKWATCH_SLOW=1`` or when ``-m`` names them."""
    if os.environ.get("RANKWATCH_SLOW") == "1" or "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow: set RANKWATCH_SLOW=1 (or -m slow) to run")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
