import unittest

from nesting.depth import depth, is_flat


class DepthTests(unittest.TestCase):
    def test_scalars(self):
        self.assertEqual(depth(5), 0)
        self.assertEqual(depth("abc"), 0)

    def test_flat(self):
        self.assertEqual(depth([1, 2, 3]), 1)

    def test_nested(self):
        self.assertEqual(depth([1, [2, [3]]]), 3)

    def test_empty_lists(self):
        self.assertEqual(depth([]), 1)
        self.assertEqual(depth([[]]), 2)
        self.assertEqual(depth([1, [[]]]), 3)

    def test_is_flat(self):
        self.assertTrue(is_flat([]))
        self.assertTrue(is_flat([1, "a"]))
        self.assertFalse(is_flat([1, [2]]))
