import unittest

from mailing.recipients import normalize_email, recipient_list


class RecipientTests(unittest.TestCase):
    def test_duplicates_keep_first_position(self):
        result = recipient_list(["b@x.org", "a@x.org", "B@x.org ", "c@x.org"])
        self.assertEqual(result, ["b@x.org", "a@x.org", "c@x.org"])

    def test_long_list_keeps_order(self):
        addresses = [f"user{n}@example.com" for n in range(40, 0, -1)]
        self.assertEqual(recipient_list(addresses + addresses), addresses)

    def test_blanks_removed(self):
        self.assertEqual(recipient_list(["", "  ", "Z@Y.com"]), ["z@y.com"])

    def test_empty(self):
        self.assertEqual(recipient_list([]), [])

    def test_normalize(self):
        self.assertEqual(normalize_email("  Ann@Example.COM\n"), "ann@example.com")
