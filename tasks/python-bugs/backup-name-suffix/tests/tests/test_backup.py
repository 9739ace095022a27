import tempfile
import unittest
from pathlib import Path

from archiver.backup import backup_path, make_backup


class BackupPathTests(unittest.TestCase):
    def test_keeps_extension(self):
        self.assertEqual(backup_path("notes.txt"), Path("notes.txt.bak"))
        self.assertEqual(backup_path("dist/archive.tar.gz"), Path("dist/archive.tar.gz.bak"))

    def test_no_extension(self):
        self.assertEqual(backup_path("Makefile"), Path("Makefile.bak"))


class MakeBackupTests(unittest.TestCase):
    def test_backups_do_not_collide(self):
        with tempfile.TemporaryDirectory() as tmp:
            csv_file = Path(tmp) / "data.csv"
            json_file = Path(tmp) / "data.json"
            csv_file.write_text("a,b\n")
            json_file.write_text("{}")
            first = make_backup(csv_file)
            second = make_backup(json_file)
            self.assertNotEqual(first, second)
            self.assertEqual(first.read_text(), "a,b\n")
            self.assertEqual(second.read_text(), "{}")
            self.assertEqual(first.parent, Path(tmp))
