import unittest

from gradebook.report import average, letter, summary


class AverageTests(unittest.TestCase):
    def test_fractional_mean(self):
        self.assertEqual(average([90, 85]), 87.5)
        self.assertAlmostEqual(average([1, 2, 2]), 5 / 3)

    def test_whole_mean(self):
        self.assertEqual(average([70, 80, 90]), 80)

    def test_empty(self):
        self.assertIsNone(average([]))


class SummaryTests(unittest.TestCase):
    def test_summary(self):
        self.assertEqual(summary([91, 90]), {"mean": 90.5, "letter": "A"})
        self.assertEqual(summary([]), {"mean": None, "letter": None})

    def test_letters(self):
        self.assertEqual(letter(90), "A")
        self.assertEqual(letter(59.9), "F")
        self.assertEqual(letter(72), "C")
