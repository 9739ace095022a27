import unittest
from decimal import Decimal

from pricing.money import apply_discount, to_cents


class ToCentsTests(unittest.TestCase):
    def test_float_halves_round_up(self):
        self.assertEqual(to_cents(2.675), Decimal("2.68"))
        self.assertEqual(to_cents(1.005), Decimal("1.01"))

    def test_negative(self):
        self.assertEqual(to_cents(-2.675), Decimal("-2.68"))

    def test_strings_and_ints(self):
        self.assertEqual(to_cents("0.125"), Decimal("0.13"))
        self.assertEqual(to_cents(3), Decimal("3.00"))
        self.assertEqual(to_cents(Decimal("9.994")), Decimal("9.99"))


class DiscountTests(unittest.TestCase):
    def test_discount(self):
        self.assertEqual(apply_discount(19.99, 10), Decimal("17.99"))
        self.assertEqual(apply_discount(10, 15), Decimal("8.50"))
