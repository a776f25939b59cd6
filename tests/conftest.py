"""Suite-wide policy: ``slow`` tests (the long loops of the Kafka robustness tests) run only on request.

CI runs everything else; before a submission, run the slow loops too: ``RANKWATCH_SLOW=1 python -m pytest``
(or ``-m slow``).
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
