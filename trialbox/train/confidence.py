"""95% confidence intervals for pass@1 and for its rise, printed beside the figures.

    wilson(172, 500)                       # (0.304, 0.387) around 0.344
    paired_rise([1, 0, 0], [1, 1, 0])      # (0.333, lo, hi): the same tasks before/after

pass@1 over n tasks is a binomial proportion: the Wilson score interval keeps its
coverage near 0 and 1 and for small n, where the normal approximation does not. The
rise is measured on the same tasks before and after, so its interval comes from the
per-task differences (each -1, 0 or +1): their mean ± z x their standard error. That is
narrower than two independent intervals would suggest, and right: the tasks are paired.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959964
"""The standard normal's 97.5% quantile."""


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials; (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def paired_rise(before: Sequence[bool | int], after: Sequence[bool | int],
                z: float = Z95) -> tuple[float, float, float]:
    """(mean, lo, hi) of after - before over the same tasks (one pair per task)."""
    if len(before) != len(after):
        raise ValueError(f"paired_rise: {len(before)} before vs {len(after)} after")
    n = len(before)
    if n == 0:
        return 0.0, -1.0, 1.0
    d = [int(a) - int(b) for b, a in zip(before, after, strict=True)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / max(1, n - 1)
    half = z * math.sqrt(var / n)
    return mean, mean - half, mean + half
