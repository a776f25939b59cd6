"""The streaming core: validated events in, published event-time windows out.

- ``join``: the columnar store of requests awaiting finalization (impressions joined with feedback).
- ``memory``: bounded memories: seen ids, feedback waiting for its impression.
- ``watermark``: how far event time has surely progressed.
- ``windows``: tumbling windows and their per-slice accumulators.
- ``staging``: finalized lists waiting for one kernel call.
- ``snapshot``: the versioned msgpack snapshot format.
- ``config``: the processor's settings, fingerprint and statistics.
- ``experiments``: experiments whose cumulative state rides in the processor's snapshot.
- ``processor``: :class:`StreamProcessor`, per-record processing, windows and snapshots.
- ``prepare``: the batch path's stateless half: clean records decoded, checked and packed into rows.
- ``batch``: the batch path, a poll's records in one call, equal to per-record processing.
- ``mapped``: the batch path for a team's own schema: translate, then the same batch path.

Stands on ``metrics/``, ``events/`` and ``experiments/``; the Kafka layer drives it.
"""
