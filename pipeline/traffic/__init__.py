"""Deterministic, realistic ranking traffic for ``rankwatch simulate``, the demo, benchmarks and tests.

- ``generator``: impressions and graded feedback with position bias, per-segment quality, experiments and
  the usual mess (duplicates, orphans, late clicks, malformed events).
"""
