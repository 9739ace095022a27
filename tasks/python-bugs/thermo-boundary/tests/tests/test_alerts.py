import unittest

from thermo.alerts import alerts, classify, to_celsius


class ClassifyTests(unittest.TestCase):
    def test_frost(self):
        self.assertEqual(classify(-5), "frost")
        self.assertEqual(classify(0), "frost")

    def test_normal(self):
        self.assertEqual(classify(0.1), "normal")
        self.assertEqual(classify(29.9), "normal")

    def test_heat(self):
        self.assertEqual(classify(30), "heat")
        self.assertEqual(classify(41), "heat")


class AlertTests(unittest.TestCase):
    def test_conversion(self):
        self.assertEqual(to_celsius(212), 100)

    def test_alerts(self):
        self.assertEqual(alerts([32, 50, 86, 10]), [(32, "frost"), (86, "heat"), (10, "frost")])
