import unittest

from calc.ops import growth, percent


class PercentTests(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(percent(1, 4), 25.0)
        self.assertEqual(percent(1, 3), 33.3)
        self.assertEqual(percent(1, 3, digits=2), 33.33)

    def test_zero_part(self):
        self.assertEqual(percent(0, 10), 0.0)

    def test_zero_whole(self):
        self.assertEqual(percent(3, 0), 0.0)
        self.assertEqual(percent(0, 0), 0.0)


class GrowthTests(unittest.TestCase):
    def test_growth(self):
        self.assertEqual(growth(50, 75), 50.0)
        self.assertEqual(growth(80, 60), -25.0)

    def test_growth_from_zero(self):
        self.assertEqual(growth(0, 10), 0.0)
