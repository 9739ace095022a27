import unittest

from metrics.scale import min_max, normalize


class NormalizeTests(unittest.TestCase):
    def test_list(self):
        self.assertEqual(normalize([1, 1, 2]), [0.25, 0.25, 0.5])

    def test_generator(self):
        self.assertEqual(normalize(x for x in [1, 1, 2]), [0.25, 0.25, 0.5])

    def test_map_object(self):
        self.assertEqual(normalize(map(int, "13")), [0.25, 0.75])

    def test_empty_and_zero(self):
        self.assertEqual(normalize([]), [])
        self.assertEqual(normalize(iter([0, 0])), [])


class MinMaxTests(unittest.TestCase):
    def test_min_max(self):
        self.assertEqual(min_max(x for x in [2, 4, 6]), [0.0, 0.5, 1.0])
        self.assertEqual(min_max([3, 3]), [0.0, 0.0])
