import unittest

from pager.core import get_page, page_count

ITEMS = list(range(1, 11))


class PageCountTests(unittest.TestCase):
    def test_exact_multiple(self):
        self.assertEqual(page_count(9, 3), 3)

    def test_partial_last_page(self):
        self.assertEqual(page_count(10, 3), 4)
        self.assertEqual(page_count(1, 20), 1)

    def test_empty(self):
        self.assertEqual(page_count(0, 5), 0)

    def test_bad_per_page(self):
        with self.assertRaises(ValueError):
            page_count(5, 0)


class GetPageTests(unittest.TestCase):
    def test_first_page(self):
        self.assertEqual(get_page(ITEMS, 1, 3), [1, 2, 3])

    def test_last_partial_page(self):
        self.assertEqual(get_page(ITEMS, 4, 3), [10])

    def test_out_of_range(self):
        with self.assertRaises(IndexError):
            get_page(ITEMS, 5, 3)
        with self.assertRaises(IndexError):
            get_page(ITEMS, 0, 3)
