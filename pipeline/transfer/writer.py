"""Ledger lines from an A/B report and offline differences (``rankwatch ab ... --ledger FILE --offline ...``).

Layout: :func:`ledger_level` (which slices of a report become lines); :func:`baseline_differences` (the
unpaired offline difference of two baseline results); :func:`ledger_entries` (report + offline differences
-> :class:`~.ledger.LedgerEntry` list).

One level of detail per run: ``rankwatch transfer`` pools the lines of a group, so an experiment's
all-segments line and its per-segment lines together would count the experiment several times in the
all-segments group. Per-segment lines (``segment = X, surface = "all"``) are written only when the report
is sliced by segment alone; otherwise only the all-segments line (``segment = surface = "all"``).

The online difference is the report's ``diff`` (candidate - reference, absolute, not the lift) with its
fixed-horizon standard error ``diff_stderr`` and ``n`` = units of both arms (items for AUCs). The offline
difference is paired over the requests both models scored (:mod:`.paired`) or, from two baseline files,
unpaired: ``diff = m_c - m_r``, ``stderr = sqrt(se_c^2 + se_r^2)``, ``n`` = requests of both. Pure:
``recorded_at`` is given by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from rankwatch.pipeline.slicing import ALL_VALUE, SliceKey
from rankwatch.pipeline.transfer.ledger import Difference, LedgerEntry
from rankwatch.pipeline.transfer.paired import PairedDifference

__all__ = ["OfflineKey", "baseline_differences", "ledger_entries", "ledger_level", "offline_by_segment"]

OfflineKey = tuple[str, str, str]  # (candidate, segment or "all", metric)


def ledger_level(by: Iterable[str]) -> str:
    """``"segment"`` when the report is sliced by segment alone, else ``"all"`` (see the module docstring)."""
    return "segment" if tuple(by) == ("segment",) else ALL_VALUE


def offline_by_segment(
    candidate: str, paired: Mapping[SliceKey, Mapping[str, PairedDifference]]
) -> dict[OfflineKey, PairedDifference]:
    """``{(candidate, segment or "all", metric): difference}`` of :func:`.paired.paired_differences` output
    computed with ``SliceSpec(by=("segment",))`` (or no slices)."""
    out: dict[OfflineKey, PairedDifference] = {}
    for key, metrics in paired.items():
        seg = dict(key).get("segment", ALL_VALUE) if key else ALL_VALUE
        if key and set(dict(key)) != {"segment"}:
            continue
        for metric, d in metrics.items():
            out[(candidate, seg, metric)] = d
    return out


def _entry_labels(entry: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(entry[k]) for k in ("segment", "surface", "variant") if k in entry}


def baseline_differences(
    candidate: str, result_candidate: Mapping[str, Any], result_reference: Mapping[str, Any]
) -> dict[OfflineKey, PairedDifference]:
    """Unpaired differences of two SPEC result documents (``overall`` and slices split on segment only).

    Per metric with a value and a standard error on both sides: ``diff = m_c - m_r``, ``stderr =
    sqrt(se_c^2 + se_r^2)``, ``n_pairs`` = the requests of both (they are not pairs: the name is shared).
    """

    def slices(result: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
        out = {ALL_VALUE: result["overall"]}
        for entry in result.get("slices", ()):
            labels = _entry_labels(entry)
            if "segment" in labels and all(v == ALL_VALUE for k, v in labels.items() if k != "segment"):
                out[labels["segment"]] = entry
        return out

    cand, ref = slices(result_candidate), slices(result_reference)
    out: dict[OfflineKey, PairedDifference] = {}
    for seg in cand.keys() & ref.keys():
        c, r = cand[seg], ref[seg]
        se_c, se_r = c.get("stderr") or {}, r.get("stderr") or {}
        for metric in c.keys() & se_c.keys() & se_r.keys():
            values = (c.get(metric), r.get(metric), se_c.get(metric), se_r.get(metric))
            if any(v is None for v in values) or metric not in r:
                continue
            mc, mr, sc, sr = (float(v) for v in values)  # type: ignore[arg-type]
            n = int(c.get("requests", 0)) + int(r.get("requests", 0))
            out[(candidate, seg, metric)] = PairedDifference(max(n, 1), mc - mr, math.hypot(sc, sr))
    return out


def ledger_entries(
    report: Mapping[str, Any],
    offline: Mapping[OfflineKey, PairedDifference],
    *,
    level: str,
    recorded_at: str,
) -> list[LedgerEntry]:
    """One entry per comparison of ``report`` (SPEC section 4 JSON plus ``diff_stderr``) at ``level``
    (``"all"`` or ``"segment"``) with a defined online difference and an offline one in ``offline``."""
    name = str(report["experiment"]["name"])
    entries: list[LedgerEntry] = []
    for c in report["comparisons"]:
        seg, surface = str(c.get("segment", ALL_VALUE)), str(c.get("surface", ALL_VALUE))
        if surface != ALL_VALUE or (seg == ALL_VALUE) != (level == ALL_VALUE):
            continue
        if any(c.get(k) is not None and c.get(k) != ALL_VALUE for k in ("variant", "model") if k in c):
            continue
        off = offline.get((c["treatment"], seg, c["metric"]))
        if c.get("diff") is None or c.get("diff_stderr") is None or off is None:
            continue
        if off.diff is None or off.stderr is None:
            continue
        entries.append(LedgerEntry(
            experiment=name, candidate=str(c["treatment"]), reference=str(c["control"]), segment=seg,
            surface=ALL_VALUE, metric=str(c["metric"]),
            offline=Difference(off.diff, off.stderr, max(off.n_pairs, 1)),
            online=Difference(float(c["diff"]), float(c["diff_stderr"]), max(int(c["n"]) + int(c["n_control"]), 1)),
            recorded_at=recorded_at,
        ))  # fmt: skip
    return entries
