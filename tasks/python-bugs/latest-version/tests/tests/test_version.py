import unittest

from releases.version import is_newer, latest, parse_version


class LatestTests(unittest.TestCase):
    def test_numeric_order(self):
        self.assertEqual(latest(["1.9.0", "1.10.0", "1.2.3"]), "1.10.0")
        self.assertEqual(latest(["v2.0", "v10.0", "v9.9"]), "v10.0")

    def test_simple(self):
        self.assertEqual(latest(["0.1.0", "0.2.0"]), "0.2.0")
        self.assertEqual(latest(["3.0.0"]), "3.0.0")

    def test_empty(self):
        self.assertIsNone(latest([]))


class ParseTests(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(parse_version(" v1.10.2 "), (1, 10, 2))

    def test_is_newer(self):
        self.assertTrue(is_newer("1.10.0", "1.9.0"))
        self.assertFalse(is_newer("1.9.0", "1.9.0"))
