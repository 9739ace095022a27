import unittest
from datetime import date

from billing.terms import add_months, due_date, next_billing_dates


class AddMonthsTests(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(add_months(date(2023, 1, 15), 1), date(2023, 2, 15))

    def test_year_wrap(self):
        self.assertEqual(add_months(date(2023, 12, 10), 1), date(2024, 1, 10))
        self.assertEqual(add_months(date(2023, 1, 10), -1), date(2022, 12, 10))

    def test_clamps_to_month_end(self):
        self.assertEqual(add_months(date(2024, 1, 31), 1), date(2024, 2, 29))
        self.assertEqual(add_months(date(2023, 1, 31), 1), date(2023, 2, 28))
        self.assertEqual(add_months(date(2023, 5, 31), -1), date(2023, 4, 30))

    def test_billing_dates(self):
        self.assertEqual(
            next_billing_dates(date(2023, 1, 31), 3),
            [date(2023, 2, 28), date(2023, 3, 31), date(2023, 4, 30)],
        )


class DueDateTests(unittest.TestCase):
    def test_due_date(self):
        self.assertEqual(due_date(date(2023, 12, 15)), date(2024, 1, 14))
        self.assertEqual(due_date(date(2023, 3, 1), net_days=14), date(2023, 3, 15))
