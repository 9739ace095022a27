import unittest

from tally.counter import WordCounter


class WordCounterTests(unittest.TestCase):
    def test_counters_are_independent(self):
        WordCounter().feed("red red blue")
        fresh = WordCounter()
        self.assertEqual(fresh.total(), 0)
        fresh.feed("green")
        self.assertEqual(fresh.most_common(), [("green", 1)])

    def test_feed_accumulates(self):
        counter = WordCounter().feed("the cat").feed("The dog")
        self.assertEqual(counter.total(), 4)
        self.assertEqual(counter.counts["the"], 2)

    def test_most_common_ties(self):
        counter = WordCounter().feed("b a c a b d")
        self.assertEqual(counter.most_common(2), [("a", 2), ("b", 2)])

    def test_apostrophes(self):
        counter = WordCounter().feed("Don't stop, don't!")
        self.assertEqual(counter.most_common(1), [("don't", 2)])
