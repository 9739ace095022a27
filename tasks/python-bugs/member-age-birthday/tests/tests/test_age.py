import unittest
from datetime import date

from members.age import age_on, is_adult


class AgeTests(unittest.TestCase):
    def test_before_birthday(self):
        self.assertEqual(age_on(date(2000, 12, 31), date(2018, 6, 1)), 17)
        self.assertEqual(age_on(date(1990, 6, 2), date(2020, 6, 1)), 29)

    def test_on_birthday(self):
        self.assertEqual(age_on(date(2000, 6, 1), date(2018, 6, 1)), 18)

    def test_after_birthday(self):
        self.assertEqual(age_on(date(2000, 1, 1), date(2018, 6, 1)), 18)

    def test_newborn(self):
        self.assertEqual(age_on(date(2023, 12, 31), date(2024, 1, 1)), 0)

    def test_is_adult(self):
        self.assertFalse(is_adult(date(2000, 12, 31), date(2018, 12, 30)))
        self.assertTrue(is_adult(date(2000, 12, 31), date(2018, 12, 31)))
