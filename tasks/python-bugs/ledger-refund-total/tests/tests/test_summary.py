import unittest

from ledger.summary import net_total, totals_by_category

ENTRIES = [
    {"category": "books", "amount": 30},
    {"category": "books", "amount": 10, "refund": True},
    {"category": "food", "amount": 12},
    {"category": "travel", "amount": 50, "refund": True},
]


class SummaryTests(unittest.TestCase):
    def test_no_refunds(self):
        entries = [{"category": "food", "amount": 5}, {"category": "food", "amount": 7}]
        self.assertEqual(totals_by_category(entries), {"food": 12})

    def test_refunds_subtracted(self):
        self.assertEqual(totals_by_category(ENTRIES), {"books": 20, "food": 12, "travel": -50})

    def test_totals_match_net(self):
        self.assertEqual(sum(totals_by_category(ENTRIES).values()), net_total(ENTRIES))

    def test_net_total(self):
        self.assertEqual(net_total(ENTRIES), -18)

    def test_empty(self):
        self.assertEqual(totals_by_category([]), {})
