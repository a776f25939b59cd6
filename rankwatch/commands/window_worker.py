"""The aggregation half of a replay in a forked worker process: the kernel, the windows and the result document.

Layout: :func:`start_window_worker` (forks the worker from the core's processor before any event, or returns
None where the worker cannot run), :class:`WindowWorker` (the core's side: a
:class:`pipeline.stream.processor.WindowsElsewhere` that ships the processor's staged batches and window closes
to the worker in order, and collects the worker's result at the end) and :func:`_serve` (the worker: applies them
to its copy of the processor with :meth:`StreamProcessor.apply_offloaded`, then builds the result document and
the ``--windows-out`` lines).

Why: a replay's core process was its bottleneck, and about a third of its time went to work that needs only
the finalized requests (numpy arrays, cheap to hand over) and the order of the window closes: the metric
kernel, the window merges and, once the input has ended, the result document (docs/benchmarks.md has the
figures). The log reader's process has spare time on the second core, and the end of a replay had one core
idle while the core finalized the last attribution window and then built the document. In the worker, that
work runs beside the join, and the document is built as soon as the last batch is aggregated.

Exactness: the worker is a ``fork`` of the processor before it saw an event, and runs the same methods on the
same batches in the same order as the processor would have (only the slice-key table is sent along, as it
grows), so the windows, their float sums and the document are the ones the in-process replay gives; the
replay tests run both ways.

Priority: while the input lasts, the core's process and the log reader are the critical path, and the worker's
work can wait; its thread runs at a lowered priority (nice :data:`_BACKGROUND_NICE`), so it takes the time they
leave on two cores instead of a third of each. Once the core has sent everything, the worker is the critical
path, and its main thread, at normal priority, takes over (Linux keeps a nice value per thread). Elsewhere the
worker runs at normal priority. In that tail (the second core idle but for it: about a third of the groups
are still to aggregate, at nice 10 the worker did little while the input lasted) two threads make the kernels'
parts ahead, which are pure and spend their time in numpy sorts that release the GIL (1.6-1.7x on two), while
the main thread adds them to the windows in order: whole replays took 0.975 of the time (docs/benchmarks.md).

Bounds: the worker holds at most :data:`_QUEUED_BYTES` of received messages (then the pipe fills and the core's
sends wait), so memory stays bounded however far the core runs ahead; the core waits for the result only
while the worker lives; a worker whose core has gone (its end of the pipe closed) drops what it holds and ends.
When it runs: by default where the replay may use two CPUs or more (:data:`_MIN_CPUS`). On two it was first
even (the replay's three processes bound by their total CPU, which the worker moves but does not cut); once the
SEs stopped calling BLAS, whose idle threads spun in every process, it paid there too: whole replays took 0.956
and 0.964 of the time without it (paired medians, ABBA order, 6 and 8 rounds, faster in 12 of 14;
docs/benchmarks.md). On one CPU it would only add a process. ``RANKWATCH_WINDOW_WORKER=process`` runs it whatever
the CPUs, ``=inline`` never; where ``fork`` is unavailable or with experiments, the replay aggregates in its own
process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rankwatch.consumers.handoff import widen_pipe
from rankwatch.errors import RankwatchError

_QUEUED_BYTES = 64 << 20  # messages the worker holds received but not yet applied (then the core's sends wait)
_END = b"end"  # the core's last message: no more operations, send the result
_RESULT_POLL_S = 1.0  # how often the core, waiting for the result, checks that the worker is alive
_BACKGROUND_NICE = 10  # the niceness of the worker's thread while the input lasts (Linux: nice is per thread)
_JOIN_TIMEOUT_S = 5.0
_TAIL_THREADS = 2  # threads making the kernels' parts ahead once the core has sent everything
_TAIL_AHEAD = 4  # groups whose parts those threads may have made, or be making, before the main thread adds them
# CPUs from which the worker runs by default: on two it takes the kernel and the document off the core's
# process, the critical path (docs/benchmarks.md); on one it would only add a process.
_MIN_CPUS = 2


def start_window_worker(proc: Any, emit: Any, finish: Any) -> WindowWorker | None:
    """A worker forked from ``proc`` (a fresh :class:`StreamProcessor`), now holding its aggregation half, or
    None (module docstring). In the worker, ``emit(windows)`` takes what each close published, and ``finish()``
    makes the result at the end (picklable: the result document), which :meth:`WindowWorker.finish` returns.
    Both run in the worker's copy of the caller's memory (a fork): what they change there stays there."""
    mode = os.environ.get("RANKWATCH_WINDOW_WORKER", "auto")
    if mode == "inline" or (mode == "auto" and not worker_by_default()):
        return None
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    if proc.config.experiments:  # their sums ride in the processor's stats
        return None
    worker = WindowWorker(proc, emit, finish)
    proc.offload_windows(worker)
    return worker


def worker_by_default() -> bool:
    """Whether the worker runs without ``RANKWATCH_WINDOW_WORKER``: from :data:`_MIN_CPUS` usable CPUs."""
    return usable_cpus() >= _MIN_CPUS


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class WindowWorker:
    """The core's side of the worker (module docstring)."""

    def __init__(self, proc: Any, emit: Any, finish: Any) -> None:
        ctx = multiprocessing.get_context("fork")
        ops_in, self._ops = ctx.Pipe(duplex=False)
        self._results, results_out = ctx.Pipe(duplex=False)
        widen_pipe(self._ops)  # a staged batch (a few MB) in a few writes
        # The worker closes its copies of this side's ends: the core's end closing (or its process ending) is
        # then the end of the worker's input, and the worker's ending that of the core's results.
        self._child = ctx.Process(target=_serve_then_exit, args=(proc, ops_in, results_out, emit, finish,
                                                       (self._ops, self._results)),
                                  name="rankwatch-window-worker", daemon=True)
        self._child.start()
        ops_in.close()
        results_out.close()
        self._pending: list[tuple[Any, ...]] = []
        self._keys_sent = 0
        self.published: dict[str, int] = dict.fromkeys(proc.config.windows, 0)

    def aggregate(self, batch: Any, combo_keys: list[Any]) -> None:
        new_keys = combo_keys[self._keys_sent:]
        self._keys_sent = len(combo_keys)
        # the worker needs the arrays only: the request ids stay here
        self._pending.append(("aggregate", dataclasses.replace(batch, request_ids=[]), new_keys))
        self._send(pickle.dumps(self._pending, protocol=pickle.HIGHEST_PROTOCOL))

    def close(self, horizon_ms: int | None, partitions: tuple[int, ...]) -> None:
        # Sent with the next batch (or the end). The core closes at every watermark step (it cannot see which
        # windows are open here); closes with no batch between them publish, at the last horizon, exactly what
        # they would one after the other (horizons only grow, windows come out by end), so only the last goes.
        if self._pending and self._pending[-1][0] == "close":
            self._pending[-1] = ("close", horizon_ms, partitions)
        else:
            self._pending.append(("close", horizon_ms, partitions))

    def _send(self, data: bytes) -> None:
        self._pending = []
        try:
            self._ops.send_bytes(data)
        except OSError:  # the worker has gone (it failed, or was killed): say why now, not at the end
            self._ops.close()
            self._result()

    def finish(self) -> Any:
        """Send what is left, wait for the worker's result (``finish()``) and return it."""
        if self._pending:
            self._send(pickle.dumps(self._pending, protocol=pickle.HIGHEST_PROTOCOL))
        self._send(_END)
        self._ops.close()
        return self._result()

    def _result(self) -> Any:
        """The worker's answer: its result, or a :class:`RankwatchError` naming why it has none."""
        try:
            while not self._results.poll(_RESULT_POLL_S):  # a bound: the worker's life, not a guess at its speed
                if not self._child.is_alive() and not self._results.poll(0):
                    raise EOFError
            tag, *payload = pickle.loads(self._results.recv_bytes())
        except EOFError:
            self._child.join(_JOIN_TIMEOUT_S)
            raise RankwatchError(f"the window worker process ended unexpectedly "
                                 f"(exit status {self._child.exitcode})") from None
        finally:
            self._results.close()
        self._child.join(_JOIN_TIMEOUT_S)
        if tag == "error":
            raise RankwatchError(f"the window worker failed: {payload[0]}")
        self.published, result = payload
        return result

    def stop(self) -> None:
        """End the worker if it is still running (an error in the core's process)."""
        self._ops.close()
        if self._child.is_alive():
            self._child.terminate()
            self._child.join(_JOIN_TIMEOUT_S)


class _Inbox:
    """The worker's received messages, at most :data:`_QUEUED_BYTES` of them (``None``: the pipe closed)."""

    def __init__(self) -> None:
        self._messages: deque[bytes | None] = deque()
        self._bytes = 0
        self._changed = threading.Condition()
        self.ended = threading.Event()  # the core sent _END: everything it will send is here or on its way

    def put(self, data: bytes | None) -> None:
        with self._changed:
            if data is None:  # the core's process has gone: what is queued is dropped, nothing waits on it
                self._messages.clear()
                self._bytes = 0
            else:
                self._changed.wait_for(lambda: self._bytes < _QUEUED_BYTES)
                self._bytes += len(data)
            self._messages.append(data)
            self._changed.notify_all()
        if data is None or data == _END:
            self.ended.set()

    def get(self) -> bytes | None:
        with self._changed:
            self._changed.wait_for(lambda: bool(self._messages))
            data = self._messages.popleft()
            self._bytes -= 0 if data is None else len(data)
            self._changed.notify_all()
            return data


def _serve_then_exit(*args: Any) -> None:
    """:func:`_serve`, then the worker's end without the interpreter's: the core waits for the worker to exit
    after the result, and freeing the windows and the worker's copy of the core object by object took 14 ms.
    The worker's files (``--windows-out``) were flushed by ``finish``; its standard streams are flushed here."""
    _serve(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(proc: Any, ops_in: Any, results_out: Any, emit: Any, finish: Any, core_ends: tuple[Any, ...]) -> None:
    """The worker: apply the core's operations to ``proc`` in order, ``emit`` what they publish; at the end,
    send ``finish()``.

    While the input lasts the operations are applied by a thread of lowered priority: the core's process and
    the log reader are the replay's critical path then, and this work can wait, so it takes the time they leave.
    Once the core has sent everything, the worker is the critical path: the main thread, at normal priority,
    takes over (on Linux a thread's nice value is its own, and a raised one cannot be lowered again).
    """
    for end in core_ends:
        end.close()
    inbox = _Inbox()

    def receive() -> None:  # reads the next message while another thread applies one (reads release the GIL)
        try:
            while True:
                data = ops_in.recv_bytes()
                inbox.put(data)
                if data == _END:
                    return
        except (EOFError, OSError):
            inbox.put(None)

    outcome: list[Any] = []  # the background thread's: True once it applied everything, or its exception

    def apply() -> bool:
        """Apply messages in order until the core has sent everything; True if the last one is applied."""
        while not inbox.ended.is_set():
            data = inbox.get()
            if data is None:
                raise EOFError("the replay's core process has gone")
            if data == _END:
                return True
            for op in pickle.loads(data):
                emit(proc.apply_offloaded(op))
        return False

    def apply_rest() -> None:
        """The rest, once the core has sent everything (all of it is in the inbox): the kernels of the staged
        batches are made ahead by two threads (their sorts release the GIL), while this thread adds them to the
        windows in order. The second core is free by then: the core's process only waits for the result."""
        ops: list[tuple[Any, ...]] = []
        while (data := inbox.get()) != _END:
            if data is None:
                raise EOFError("the replay's core process has gone")
            ops += pickle.loads(data)
        kernels = iter([i for i, op in enumerate(ops) if op[0] == "aggregate"])
        with ThreadPoolExecutor(max_workers=_TAIL_THREADS, thread_name_prefix="rankwatch-window-kernel") as pool:
            made: dict[int, Any] = {}

            def ahead() -> None:  # at most _TAIL_AHEAD groups' parts made and not yet added: memory stays bounded
                while len(made) < _TAIL_AHEAD and (i := next(kernels, None)) is not None:
                    made[i] = pool.submit(proc.offloaded_parts, ops[i])

            ahead()
            for i, op in enumerate(ops):
                parts = made.pop(i).result() if i in made else None
                ahead()
                emit(proc.apply_offloaded(op, parts))

    def background() -> None:
        _lower_priority()
        try:
            outcome.append(apply())
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            outcome.append(e)

    threading.Thread(target=receive, name="rankwatch-window-worker-receive", daemon=True).start()
    helper = threading.Thread(target=background, name="rankwatch-window-worker-background", daemon=True)
    helper.start()
    try:
        helper.join()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        if not outcome[0]:
            apply_rest()  # at normal priority
        result = finish()
        results_out.send_bytes(pickle.dumps(("done", proc.stats().windows_published, result),
                                            protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as e:  # noqa: BLE001 - reported to the core's process, which names it
        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        with contextlib.suppress(OSError):  # the core's process has gone: nobody to tell
            results_out.send_bytes(pickle.dumps(("error", detail)))


def _lower_priority() -> None:
    """Lower the calling thread's priority, where a nice value belongs to a thread (Linux); else nothing."""
    if sys.platform.startswith("linux") and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _BACKGROUND_NICE)
        except OSError:
            pass
