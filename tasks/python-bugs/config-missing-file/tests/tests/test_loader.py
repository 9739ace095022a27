import tempfile
import unittest
from pathlib import Path

from settings.loader import DEFAULTS, ConfigError, load_config


class LoadConfigTests(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self._tmp.name)

    def tearDown(self):
        self._tmp.cleanup()

    def write(self, text):
        path = self.dir / "settings.json"
        path.write_text(text, encoding="utf-8")
        return path

    def test_missing_file_gives_defaults(self):
        config = load_config(self.dir / "missing.json")
        self.assertEqual(config, DEFAULTS)
        config["port"] = 1
        self.assertEqual(DEFAULTS["port"], 8000)

    def test_overlay(self):
        config = load_config(self.write('{"port": 9000, "name": "api"}'))
        self.assertEqual(config, {"host": "127.0.0.1", "port": 9000, "debug": False, "name": "api"})

    def test_invalid_json(self):
        with self.assertRaises(ConfigError):
            load_config(self.write("{port: 9000"))

    def test_not_an_object(self):
        with self.assertRaises(ConfigError):
            load_config(self.write("[1, 2]"))
