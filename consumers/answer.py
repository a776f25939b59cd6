"""The answer to a request the consuming side did not wait for (the periodic checkpoint's snapshot).

Layout: :class:`Answer` (a one-shot slot filled by :class:`consumers.core_process.CoreProcess` when the
answer is read, in order) and :func:`ask_snapshot` (a processor's snapshot, asked without waiting: in order
from the core process, at once in-process).

Why: the periodic checkpoint used to wait for its snapshot behind every batch in flight and the core's
pickling of the state, and the consuming thread neither polled nor fed meanwhile (docs/kafka.md,
"Effectively once"); with the answer asked for and collected on a later turn of the loop it does both.
"""

from __future__ import annotations

from typing import Any


class Answer:
    """The answer to a request sent without waiting (:meth:`CoreProcess.call_async`): ``done`` once it was
    read, in order, after every earlier answer was handed on. :meth:`cancel` discards it when it comes."""

    def __init__(self) -> None:
        self.done = False
        self.cancelled = False
        self._result: Any = None
        self._error: BaseException | None = None

    @classmethod
    def of(cls, result: Any) -> Answer:
        """An answer already here (a snapshot taken in-process, or waited for)."""
        answer = cls()
        answer.fill(result, None)
        return answer

    def fill(self, result: Any, error: BaseException | None) -> None:
        if not self.cancelled:
            self._result, self._error = result, error
        self.done = True

    def cancel(self) -> None:
        self.cancelled = True
        self._result = self._error = None

    def result(self) -> Any:
        """The result (raises the request's error, as a waiting call would)."""
        assert self.done and not self.cancelled
        if self._error is not None:
            raise self._error
        return self._result


def ask_snapshot(processor: Any) -> Answer:
    """Ask ``processor`` for its snapshot without waiting: a :class:`RemoteProcessor`'s comes in order with
    the core's answers; an in-process processor's is taken at once (the answer is already done)."""
    asking = getattr(processor, "snapshot_async", None)
    if asking is not None:
        return asking()  # type: ignore[no-any-return]
    return Answer.of(processor.snapshot())
