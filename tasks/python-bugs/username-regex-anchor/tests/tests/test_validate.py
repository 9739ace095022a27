import unittest

from accounts.validate import is_valid_username


class UsernameTests(unittest.TestCase):
    def test_valid(self):
        for name in ("bob", "alice_99", "x" * 16):
            self.assertTrue(is_valid_username(name), name)

    def test_too_short_or_bad_start(self):
        for name in ("ab", "9lives", "_bob", ""):
            self.assertFalse(is_valid_username(name), name)

    def test_trailing_garbage(self):
        for name in ("alice!!", "bob smith", "carol\n", "dave-2"):
            self.assertFalse(is_valid_username(name), name)

    def test_too_long(self):
        self.assertFalse(is_valid_username("x" * 17))
        self.assertFalse(is_valid_username("a" * 30))

    def test_reserved(self):
        self.assertFalse(is_valid_username("admin"))
