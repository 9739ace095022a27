import json
import unittest

from confdiff.diff import changed_keys, describe

TEXT = '{"port": 8080, "name": "web", "tags": ["a", "b"], "limits": {"cpu": 2}}'


class ChangedKeysTests(unittest.TestCase):
    def test_equal_configs(self):
        self.assertEqual(changed_keys(json.loads(TEXT), json.loads(TEXT)), [])

    def test_changed_value(self):
        new = json.loads(TEXT)
        new["port"] = 9090
        self.assertEqual(changed_keys(json.loads(TEXT), new), ["port"])

    def test_added_and_removed(self):
        old = json.loads(TEXT)
        new = json.loads(TEXT)
        del new["name"]
        new["debug"] = True
        self.assertEqual(changed_keys(old, new), ["debug", "name"])


class DescribeTests(unittest.TestCase):
    def test_describe(self):
        old = json.loads(TEXT)
        new = json.loads(TEXT)
        new["port"] = 9090
        new["extra"] = 1
        del new["tags"]
        self.assertEqual(describe(old, new), ["+ extra = 1", "~ port: 8080 -> 9090", "- tags"])
