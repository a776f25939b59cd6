"""Types of the C row scanner (pipeline/stream/_rowscan.c)."""

from collections.abc import Callable
from typing import Any

def impressions(lines: list[bytes], max_event_bytes: int, max_items: int, by: tuple[int, ...],
                labels: dict[tuple[Any, ...], tuple[Any, ...]], user_keys: dict[str, int], cache_entries: int,
                key_of: Callable[[str, str | None], int]) -> tuple[list[list[Any]], list[int]]: ...
def feedback(lines: list[bytes], max_event_bytes: int,
             grades: dict[str, int]) -> tuple[list[list[Any]], list[int]]: ...
