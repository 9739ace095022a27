import unittest

from textkit.slug import ascii_fold, slugify


class SlugifyTests(unittest.TestCase):
    def test_plain_ascii(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_accents_are_folded(self):
        self.assertEqual(slugify("Café au lait"), "cafe-au-lait")
        self.assertEqual(slugify("Crème Brûlée"), "creme-brulee")

    def test_ascii_fold(self):
        self.assertEqual(ascii_fold("naïve façade"), "naive facade")

    def test_trims_separators(self):
        self.assertEqual(slugify("  --Already-Slugged--  "), "already-slugged")

    def test_max_length(self):
        self.assertEqual(len(slugify("a" * 60)), 50)
        self.assertEqual(slugify("abc def", max_length=4), "abc")
