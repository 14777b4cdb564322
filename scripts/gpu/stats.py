"""Statistics of the step-cost benchmark (scripts/gpu/step_cost.py), in plain Python (no
numpy on the device is assumed): per-round ratios to the raw driver, their median and a
95 % percentile-bootstrap interval of that median.

A round runs every way once, in an order that rotates from round to round; the ratio of
a way in a round is its time over raw's in the same round, so that what drifts between
rounds (clocks, other tenants) cancels. The interval is of the median of those ratios:
RESAMPLES resamples of the rounds with replacement (a fixed seed: the same figures give
the same interval), the 2.5th and 97.5th percentiles of their medians.
"""

import random

RESAMPLES = 10000


def median(values):
    v = sorted(values)
    n = len(v)
    if n == 0:
        raise ValueError("the median of no values")
    mid = n // 2
    return v[mid] if n % 2 else (v[mid - 1] + v[mid]) / 2


def percentile(sorted_values, q):
    """The q-th percentile (0..100) of sorted values, linear between the closest ranks."""
    v = sorted_values
    if not v:
        raise ValueError("a percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("percentile %r is not within 0..100" % q)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def bootstrap_median_interval(values, level=95.0, resamples=RESAMPLES, seed=20261128):
    """(low, high): the percentile-bootstrap interval of the median at `level` percent."""
    if not values:
        raise ValueError("an interval of no values")
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(median([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (100.0 - level) / 2
    return percentile(meds, tail), percentile(meds, 100.0 - tail)


def rotation(ways, round_index):
    """The order of the ways in round `round_index` (0-based): rotated by one each round,
    so that every way runs first, second, ... equally often over len(ways) rounds."""
    k = round_index % len(ways)
    return list(ways[k:]) + list(ways[:k])


def round_ratios(rounds, way, base="raw"):
    """The per-round ratios way/base of `rounds` ([{way: value}]); a round that lacks
    either is left out."""
    out = []
    for r in rounds:
        if way in r and base in r and r[base] > 0:
            out.append(r[way] / r[base])
    return out


def summarize(rounds, way, base="raw"):
    """{"rounds", "ratios", "median", "low", "high"} of way against base (None when no
    round has both)."""
    ratios = round_ratios(rounds, way, base)
    if not ratios:
        return None
    low, high = bootstrap_median_interval(ratios)
    return {"rounds": len(ratios), "ratios": [round(x, 5) for x in ratios], "median": round(median(ratios), 5),
            "low": round(low, 5), "high": round(high, 5)}
