"""Offline-to-online transfer: does an offline gain show up online? (docs/transfer.md)

Layout:

- :mod:`.ledger`: the ledger (JSONL, one comparison a line: a candidate against a reference in one slice for
  one metric, with the offline and the online difference and their standard errors); parse, validate,
  serialise, read files;
- :mod:`.fieller`: the per-comparison ratio online / offline with its Fieller interval;
- :mod:`.statistics`: across comparisons, from sample moments: the OLS slope, the errors-in-variables
  (BCES) corrected slope and correlation, sign agreement, Kendall's tau-b;
- :mod:`.bootstrap`: the corrected slope's jackknife t interval; seeded, vectorised bootstrap over
  comparisons for the corrected correlation and the predicted online difference of a candidate;
- :mod:`.report`: grouping of ledger entries and the JSON document of ``rankwatch transfer``;
- :mod:`.paired`: paired offline differences of two models over shared requests (DeLong for AUC-ROC);
- :mod:`.writer`: ledger lines from an A/B report and offline differences (``rankwatch ab --ledger``).

Why: an offline metric is only worth optimising if its gains transfer online. Each offline difference is
measured with noise, so a regression of online on offline differences is biased toward 0 (attenuation);
the standard errors every ledger line carries are what lets the bias be removed. Pure like the rest of
``pipeline``: no I/O beyond reading ledger files, no wall clock (``recorded_at`` comes from the caller).
"""

from rankwatch.pipeline.transfer.ledger import (
    Difference,
    LedgerEntry,
    LedgerError,
    entry_to_line,
    parse_ledger_line,
    read_ledgers,
)
from rankwatch.pipeline.transfer.report import TransferGroup, groups_document, transfer_groups

__all__ = [
    "Difference",
    "LedgerEntry",
    "LedgerError",
    "TransferGroup",
    "entry_to_line",
    "groups_document",
    "parse_ledger_line",
    "read_ledgers",
    "transfer_groups",
]
