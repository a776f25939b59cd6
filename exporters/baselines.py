"""Offline baselines for the exporter: load baseline files, serve them, reload them when they change.

A baseline file is what ``rankwatch offline --output FILE`` writes (``format: rankwatch-baseline/1``; the
SPEC result document under ``result``). Each file becomes ``source="offline", window="baseline"`` series.
A file that describes one variant (top-level ``variant``) and whose slices do not split on variant is
served with that ``variant`` label, so per-variant baselines line up with per-variant online slices.

Reload semantics (:class:`BaselineWatcher`): a file is re-read when its modification time, size or inode
changes. A file that cannot be read (corrupt, half written, deleted) keeps the last good baseline in
service, sets ``rankwatch_baseline_loaded{baseline}`` to 0, and is retried at every reload until a good
version appears; every failed attempt counts in ``rankwatch_baseline_load_errors_total{baseline}``, so
``increase(...[15m]) > 0`` stays true for as long as the file stays broken. A file computed with other
metric options or other slice labels than the service's (:class:`BaselineExpectation`) is a broken file too:
its drift would compare different quantities. A ``directory`` is rescanned at every reload: a new ``*.json``
starts serving, a removed one stops.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rankwatch.exporters.series import SeriesValues
from rankwatch.pipeline.metrics.drift import ScoreDistribution
from rankwatch.pipeline.metrics.options import MetricOptions
from rankwatch.pipeline.offline.baseline import baseline_mismatch, parse_baseline


class BaselineSink(Protocol):
    """Where loaded baselines go (the exporter's ``MetricsState``); a protocol so this module need not import it."""

    def set_baselines(self, baselines: Sequence[LoadedBaseline]) -> None: ...

    def record_baseline_load(self, name: str, *, ok: bool) -> None: ...


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedBaseline:
    """One baseline file as served: its name (the ``baseline`` label), age reference and rows."""

    name: str
    path: Path
    created: float  # epoch seconds the baseline was computed (the file's ``created``)
    model: str | None
    variant: str | None
    rows: tuple[tuple[Mapping[str, str], SeriesValues], ...]  # raw labels -> values, overall first


@dataclass(frozen=True)
class BaselineExpectation:
    """What a baseline must have been computed with to be comparable: the service's options and slices."""

    options: MetricOptions
    slice_by: tuple[str, ...]


def baseline_name(path: Path) -> str:
    """The ``baseline`` label of a file: its file name (bounded by configuration, stable across reloads)."""
    return path.name


def parse_baseline_file(data: bytes, *, path: Path, expect: BaselineExpectation | None = None) -> LoadedBaseline:
    """Parse and validate a baseline file's bytes (``pipeline.offline.baseline.parse_baseline`` validates).

    Raises ``ValueError`` naming the file and what is wrong, including (with ``expect``) the first metric
    option or slice label that differs from the service's.
    """
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a baseline file: invalid JSON ({e})") from None
    baseline = parse_baseline(doc, source=str(path))
    if expect is not None:
        why = baseline_mismatch(baseline, expect.options, expect.slice_by)
        if why is not None:
            raise ValueError(f"{path}: computed with other metric options: {why}")
    metric_names = baseline.options.metric_names
    rows = [(_labels({}, baseline.variant), _values(baseline.overall, metric_names))]
    for entry in baseline.result["slices"]:
        rows.append((_labels(entry, baseline.variant), _values(entry, metric_names)))
    return LoadedBaseline(
        name=baseline_name(path),
        path=path,
        created=baseline.created.timestamp(),
        model=baseline.model,
        variant=baseline.variant,
        rows=tuple(rows),
    )


def _labels(entry: Mapping[str, Any], file_variant: str | None) -> dict[str, str]:
    labels = {k: str(entry[k]) for k in ("segment", "surface", "variant") if k in entry}
    if "variant" not in labels and file_variant is not None:
        labels["variant"] = file_variant
    return labels


def _values(entry: Mapping[str, Any], metric_names: tuple[str, ...]) -> SeriesValues:
    metrics = {name: None if entry[name] is None else float(entry[name]) for name in metric_names}
    ses = entry.get("stderr") or {}  # absent in baseline files written by older versions
    stderr = {name: None if ses.get(name) is None else float(ses[name]) for name in metric_names}
    # optional in files written before it (parse_baseline has validated the distribution)
    ctr = tuple(None if v is None else float(v) for v in entry.get("position_ctr") or ())
    dist = entry.get("score_distribution")
    return SeriesValues(
        requests=int(entry["requests"]), metrics=metrics, stderr=stderr, position_ctr=ctr,
        score_distribution=None if dist is None else ScoreDistribution.from_dict(dist),
    )  # fmt: skip


def load_baseline_file(path: str | os.PathLike[str], *, expect: BaselineExpectation | None = None) -> LoadedBaseline:
    """Read one baseline file. Raises ``OSError`` (missing, unreadable) or ``ValueError`` (corrupt, other options)."""
    p = Path(path)
    before = p.stat()
    data = p.read_bytes()
    after = p.stat()
    if (before.st_mtime_ns, before.st_size) != (after.st_mtime_ns, after.st_size) or len(
        data
    ) != after.st_size:
        # Being written while we read it: treat as unreadable now; the next poll sees the final version.
        raise ValueError(f"{p}: changed while being read")
    return parse_baseline_file(data, path=p, expect=expect)


@dataclass(frozen=True)
class _FileStamp:
    mtime_ns: int
    size: int
    inode: int


class BaselineWatcher:
    """Keeps the baselines of ``paths`` loaded into a :class:`BaselineSink` and reloads changed files.

    :meth:`reload` is what the APScheduler job calls; it is safe to call from any thread (one reload at
    a time). The order of ``paths`` decides which file wins when two give the same label set; the
    ``*.json`` files of ``directory`` (rescanned at every reload, sorted by name) come after them.
    ``expect`` rejects files computed with other metric options or slice labels.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]], state: BaselineSink, *,
                 directory: str | os.PathLike[str] | None = None,
                 expect: BaselineExpectation | None = None) -> None:
        self._listed = [Path(p) for p in paths]
        self.directory = None if directory is None else Path(directory)
        self.expect = expect
        self.paths = list(self._listed)
        self._rescan()
        self._state = state
        self._lock = threading.Lock()
        self._stamps: dict[Path, _FileStamp | None] = {}
        self._loaded: dict[Path, LoadedBaseline] = {}
        self.last_errors: dict[str, str] = {}

    def _rescan(self) -> bool:
        """Listed files, then the directory's ``*.json`` files; True when the set changed."""
        paths = list(self._listed)
        if self.directory is not None:
            try:
                found = sorted(self.directory.glob("*.json"))
            except OSError as e:  # the directory went away: keep what it held, report it
                log.warning("baseline directory %s not rescanned: %s", self.directory, e)
                found = [p for p in self.paths if p not in self._listed]
            paths += [p for p in found if p not in self._listed]
        names = [baseline_name(p) for p in paths]
        if len(set(names)) != len(names):
            raise ValueError("baseline files must have distinct file names (the name is the series label)")
        changed = paths != self.paths
        self.paths = paths
        return changed

    def load_initial(self, *, strict: bool = False) -> None:
        """First load. With ``strict``, a missing or corrupt file raises instead of being reported."""
        with self._lock:
            for path in self.paths:
                ok = self._load(path, _stamp(path))
                if strict and not ok:
                    raise ValueError(self.last_errors[baseline_name(path)])
            self._publish()

    def reload(self) -> bool:
        """Re-read files whose stamp changed; returns True when the served baselines changed."""
        with self._lock:
            try:
                changed = self._rescan()
            except ValueError as e:  # a new file in the directory repeats a listed file's name
                log.warning("baseline directory %s: %s; not rescanned", self.directory, e)
                changed = False
            for path in [p for p in {*self._loaded, *self._stamps} if p not in self.paths]:
                changed |= self._loaded.pop(path, None) is not None  # removed from the directory: not served
                self._stamps.pop(path, None)
                self.last_errors.pop(baseline_name(path), None)
            for path in self.paths:
                stamp = _stamp(path)
                failed = baseline_name(path) in self.last_errors
                if path in self._stamps and stamp == self._stamps[path] and not failed:
                    continue
                if self._load(path, stamp):
                    changed = True
            if changed:
                self._publish()
            return changed

    def _load(self, path: Path, stamp: _FileStamp | None) -> bool:
        name = baseline_name(path)
        self._stamps[path] = stamp
        try:
            if stamp is None:
                raise FileNotFoundError(f"{path}: no such file")
            baseline = load_baseline_file(path, expect=self.expect)
        except (OSError, ValueError) as e:
            # Warn once per distinct problem: a broken file is retried at every reload.
            level = logging.DEBUG if self.last_errors.get(name) == str(e) else logging.WARNING
            self.last_errors[name] = str(e)
            log.log(level, "baseline %s not (re)loaded, keeping the previous one: %s", name, e)
            self._state.record_baseline_load(name, ok=False)
            return False
        self._loaded[path] = baseline
        self.last_errors.pop(name, None)
        self._state.record_baseline_load(name, ok=True)
        return True

    def _publish(self) -> None:
        self._state.set_baselines([self._loaded[p] for p in self.paths if p in self._loaded])


def _stamp(path: Path) -> _FileStamp | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _FileStamp(st.st_mtime_ns, st.st_size, st.st_ino)
