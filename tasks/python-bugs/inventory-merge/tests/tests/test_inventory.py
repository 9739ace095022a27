import unittest

from stock.inventory import low_stock, merge_counts


class MergeTests(unittest.TestCase):
    def test_same_sku_is_summed(self):
        self.assertEqual(merge_counts({"A1": 3}, {"A1": 4, "B2": 1}), {"A1": 7, "B2": 1})

    def test_three_reports(self):
        merged = merge_counts({"A1": 1}, {"A1": 1}, {"A1": 1, "C3": 9})
        self.assertEqual(merged, {"A1": 3, "C3": 9})

    def test_disjoint(self):
        self.assertEqual(merge_counts({"A1": 2}, {"B2": 5}), {"A1": 2, "B2": 5})

    def test_inputs_untouched(self):
        first, second = {"A1": 3}, {"A1": 4}
        merge_counts(first, second)
        self.assertEqual(first, {"A1": 3})
        self.assertEqual(second, {"A1": 4})

    def test_empty(self):
        self.assertEqual(merge_counts(), {})


class LowStockTests(unittest.TestCase):
    def test_low_stock_after_merge(self):
        counts = merge_counts({"A1": 3, "B2": 1}, {"A1": 4, "C3": 2})
        self.assertEqual(low_stock(counts), ["B2", "C3"])
