import unittest

from shop.cart import Cart


class CartTests(unittest.TestCase):
    def test_new_carts_are_independent(self):
        first = Cart()
        first.add("apple", 2, 0.5)
        second = Cart()
        self.assertEqual(len(second), 0)
        self.assertEqual(second.total(), 0)
        second.add("pear", 1, 1.0)
        self.assertEqual(len(first), 2)

    def test_add_merges_lines(self):
        cart = Cart()
        cart.add("apple", 2, 0.5)
        cart.add("apple", 3, 0.5)
        self.assertEqual(cart.lines, [("apple", 5, 0.5)])

    def test_total(self):
        cart = Cart()
        cart.add("apple", 3, 0.1)
        cart.add("milk", 1, 1.25)
        self.assertEqual(cart.total(), 1.55)
        self.assertEqual(len(cart), 4)

    def test_initial_lines(self):
        cart = Cart([("tea", 2, 3.0)])
        self.assertEqual(cart.total(), 6.0)
