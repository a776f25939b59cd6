"""Offline evaluation: evaluation sets of any size into baselines, with the kernel of ``metrics/``.

- ``readers``: reading and validating evaluation sets (CSV, JSONL, Parquet) into arrays.
- ``columns``: column codecs (ids, text labels, users, numbers); ``renames``: a team's column names
  (``--columns``).
- ``grouping``: grouping rows by request with integer codes.
- ``sorting``: rank order of a request's items (by position, or by score descending).
- ``baseline``: metrics per slice and the baseline file the service loads.
- ``batches``, ``spill``, ``partial``, ``streaming``: bounded memory: batches of rows, out-of-core
  grouping, partial baselines merged exactly, and the streaming driver equal to the in-memory path.
"""
