"""Aging: a waiting request's dispatch rank rises one class per interval.

Aging changes dispatch order only; it never grants preemption rights and
never removes a request's own preemptibility (the scheduler uses the class,
not the aged rank, for those).
"""

from __future__ import annotations


def aged_rank(cls: int, waited_s: float, interval_s: float | None, ceiling: int) -> int:
    """Dispatch rank of a class-``cls`` request that has waited ``waited_s``.

    It rises one rank per ``interval_s`` but never above ``ceiling`` (nor
    above its own class when that is already at or above the ceiling).
    """
    if interval_s is None or cls <= ceiling or waited_s < interval_s:
        return cls
    return max(ceiling, cls - int(waited_s // interval_s))
