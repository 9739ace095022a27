import tempfile
import unittest
from pathlib import Path

from highscores.store import load_scores, record, save_scores


class StoreTests(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.path = Path(self._tmp.name) / "scores.json"

    def tearDown(self):
        self._tmp.cleanup()

    def test_missing_file(self):
        self.assertEqual(load_scores(self.path), {})

    def test_round_trip(self):
        save_scores(self.path, {1: 100, 10: 5, 2: 7})
        self.assertEqual(load_scores(self.path), {1: 100, 2: 7, 10: 5})

    def test_record_keeps_best(self):
        self.assertEqual(record(self.path, 1, 100), 100)
        self.assertEqual(record(self.path, 1, 50), 100)
        self.assertEqual(record(self.path, 2, 30), 30)
        self.assertEqual(load_scores(self.path), {1: 100, 2: 30})

    def test_record_improves(self):
        record(self.path, 3, 10)
        self.assertEqual(record(self.path, 3, 12), 12)
