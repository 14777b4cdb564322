"""Unit tests of scripts/gpu/stats.py: python3 -m unittest discover -s scripts/gpu -p 'test_stats.py'
(tests/bench/gpu_run.rs runs them in CI)."""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stats  # noqa: E402


class Median(unittest.TestCase):
    def test_odd_and_even(self):
        self.assertEqual(stats.median([3, 1, 2]), 2)
        self.assertEqual(stats.median([4, 1, 3, 2]), 2.5)
        self.assertEqual(stats.median([7]), 7)

    def test_empty_is_an_error(self):
        with self.assertRaises(ValueError):
            stats.median([])


class Percentile(unittest.TestCase):
    def test_ends_and_between(self):
        v = [10.0, 20.0, 30.0, 40.0, 50.0]
        self.assertEqual(stats.percentile(v, 0), 10.0)
        self.assertEqual(stats.percentile(v, 100), 50.0)
        self.assertEqual(stats.percentile(v, 50), 30.0)
        self.assertAlmostEqual(stats.percentile(v, 2.5), 11.0)  # 0.1 of the way from 10 to 20
        self.assertAlmostEqual(stats.percentile(v, 97.5), 49.0)

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            stats.percentile([1.0], 101)


class Bootstrap(unittest.TestCase):
    def test_equal_values_give_a_point(self):
        self.assertEqual(stats.bootstrap_median_interval([1.02] * 8), (1.02, 1.02))

    def test_interval_holds_the_median_and_lies_within_the_values(self):
        v = [1.00, 1.01, 1.03, 0.99, 1.02, 1.05, 1.00, 1.01, 1.04, 0.98]
        low, high = stats.bootstrap_median_interval(v)
        self.assertLessEqual(low, stats.median(v))
        self.assertGreaterEqual(high, stats.median(v))
        self.assertGreaterEqual(low, min(v))
        self.assertLessEqual(high, max(v))
        self.assertLess(low, high)

    def test_seeded_so_the_same_figures_give_the_same_interval(self):
        v = [1.1, 0.9, 1.0, 1.2, 1.05, 0.95, 1.0, 1.15]
        self.assertEqual(stats.bootstrap_median_interval(v), stats.bootstrap_median_interval(v))

    def test_wider_spread_gives_a_wider_interval(self):
        narrow = [1.0 + 0.001 * i for i in range(9)]
        wide = [1.0 + 0.05 * i for i in range(9)]
        n_lo, n_hi = stats.bootstrap_median_interval(narrow)
        w_lo, w_hi = stats.bootstrap_median_interval(wide)
        self.assertLess(n_hi - n_lo, w_hi - w_lo)

    def test_a_single_outlier_barely_moves_the_median_interval(self):
        v = [1.0] * 8 + [5.0]
        self.assertEqual(stats.bootstrap_median_interval(v)[0], 1.0)
        self.assertLess(stats.bootstrap_median_interval(v)[1], 5.0)


class Rounds(unittest.TestCase):
    def test_rotation_puts_each_way_first_once_per_cycle(self):
        ways = ["raw", "gpucap", "pool", "hami"]
        firsts = [stats.rotation(ways, r)[0] for r in range(8)]
        self.assertEqual(firsts, ways + ways)
        self.assertEqual(stats.rotation(ways, 1), ["gpucap", "pool", "hami", "raw"])
        for r in range(4):
            self.assertEqual(sorted(stats.rotation(ways, r)), sorted(ways))

    def test_ratios_are_per_round(self):
        rounds = [{"raw": 10.0, "gpucap": 10.5}, {"raw": 20.0, "gpucap": 20.2}, {"raw": 5.0}]
        self.assertEqual(stats.round_ratios(rounds, "gpucap"), [1.05, 1.01])

    def test_summary(self):
        rounds = [{"raw": 10.0, "gpucap": 10.0 * r} for r in (1.01, 1.02, 1.00, 1.03, 1.01, 1.02, 1.00, 1.01)]
        s = stats.summarize(rounds, "gpucap")
        self.assertEqual(s["rounds"], 8)
        self.assertAlmostEqual(s["median"], 1.01)
        self.assertLessEqual(s["low"], s["median"])
        self.assertGreaterEqual(s["high"], s["median"])
        self.assertIsNone(stats.summarize(rounds, "hami"))


if __name__ == "__main__":
    unittest.main()
