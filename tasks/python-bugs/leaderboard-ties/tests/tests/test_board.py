import unittest

from ranking.board import Entry, standings, top


class BoardTests(unittest.TestCase):
    def test_highest_first(self):
        entries = [Entry("a", 1), Entry("b", 5), Entry("c", 3)]
        self.assertEqual([e.score for e in standings(entries)], [5, 3, 1])

    def test_ties_alphabetical(self):
        entries = [Entry("bob", 10), Entry("alice", 10), Entry("carol", 7)]
        self.assertEqual(top(entries), ["alice", "bob", "carol"])

    def test_tie_at_cutoff(self):
        entries = [Entry("dan", 4), Entry("eve", 9), Entry("cat", 4), Entry("ann", 2)]
        self.assertEqual(top(entries, 2), ["eve", "cat"])

    def test_empty(self):
        self.assertEqual(top([]), [])
