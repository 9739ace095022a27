import unittest

from batching.chunks import batch_sizes, chunked


class ChunkedTests(unittest.TestCase):
    def test_remainder(self):
        self.assertEqual(chunked(range(7), 3), [[0, 1, 2], [3, 4, 5], [6]])

    def test_exact_multiple(self):
        self.assertEqual(chunked([1, 2, 3], 3), [[1, 2, 3]])
        self.assertEqual(chunked("abcd", 2), [["a", "b"], ["c", "d"]])

    def test_size_larger_than_input(self):
        self.assertEqual(chunked([1, 2], 5), [[1, 2]])

    def test_empty(self):
        self.assertEqual(chunked([], 3), [])

    def test_invalid_size(self):
        with self.assertRaises(ValueError):
            chunked([1], 0)

    def test_batch_sizes(self):
        self.assertEqual(batch_sizes(7, 3), [3, 3, 1])
        self.assertEqual(sum(batch_sizes(1000, 7)), 1000)
