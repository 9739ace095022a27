import unittest

from validation.rules import build_checks, validate

LIMITS = {"age": (0, 130), "percent": (0, 100), "temp": (-50, 60)}


class CheckTests(unittest.TestCase):
    def test_single_field(self):
        check = build_checks({"age": (0, 130)})["age"]
        self.assertTrue(check(0))
        self.assertTrue(check(130))
        self.assertFalse(check(131))

    def test_each_field_has_its_own_limits(self):
        checks = build_checks(LIMITS)
        self.assertTrue(checks["age"](120))
        self.assertFalse(checks["percent"](120))
        self.assertTrue(checks["temp"](-40))
        self.assertFalse(checks["age"](-40))


class ValidateTests(unittest.TestCase):
    def test_valid_record(self):
        self.assertEqual(validate({"age": 120, "percent": 50, "temp": 20}, LIMITS), [])

    def test_violations(self):
        self.assertEqual(validate({"age": 200, "percent": 101, "temp": 0}, LIMITS), ["age", "percent"])

    def test_missing_and_extra_fields(self):
        self.assertEqual(validate({"percent": 50, "name": "x"}, LIMITS), [])
