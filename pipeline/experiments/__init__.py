"""A/B experiments (docs/experiments.md): definitions, sufficient statistics, statistics and reports.

- ``spec``: one experiment's definition (``[[experiments]]`` or ``rankwatch ab`` options).
- ``data``: per-arm, per-slice sufficient statistics from evaluation rows or logged events.
- ``stats``: lifts, fixed and always-valid intervals, SRM, Benjamini-Hochberg (pure functions).
- ``auc``: standard errors of an arm's pooled AUCs.
- ``report``: the A/B report document.
- ``online``: cumulative state from published windows (request unit).
- ``users``: per-user sums for experiments whose unit is the user.

Stands on ``metrics/``, ``events/`` and ``offline/``; the streaming core carries its online state.
"""
