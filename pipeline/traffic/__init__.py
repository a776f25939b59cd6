"""Deterministic, realistic ranking traffic for ``rankwatch simulate``, the demo, benchmarks and tests.

- ``generator``: impressions and graded feedback with position bias, per-segment quality, experiments and
  the usual mess (duplicates, orphans, late clicks, malformed events).
- ``versions``: a sequence of model versions with a known offline-to-online transfer per segment.
"""
