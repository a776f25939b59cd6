"""Events of the contract (docs/events.md): what arrives from Kafka or a log file, and what is rejected.

- ``records``: decoded, validated impressions and feedback, the types the join takes.
- ``validation``: raw bytes to records, or a rejection with its reason.
- ``deadletter``: rejected events with their raw bytes and reason, for a person to inspect.

Why a room of its own: how a team's events read (formats, field mapping) changes without the join,
windows or kernel knowing.
"""
