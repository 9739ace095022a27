import unittest

from envfile.parser import parse_env, parse_line


class ParseTests(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(parse_env("HOST=localhost\nPORT = 8000\n"), {"HOST": "localhost", "PORT": "8000"})

    def test_quotes(self):
        self.assertEqual(parse_line("NAME=\"My App\""), ("NAME", "My App"))
        self.assertEqual(parse_line("Q='x'"), ("Q", "x"))

    def test_comments_and_blanks(self):
        self.assertEqual(parse_env("# comment\n\n  \nA=1\n"), {"A": "1"})

    def test_value_with_equals(self):
        text = "TOKEN=abc==\nDB_URL=postgres://h/db?sslmode=require\nEXPR='a=b'\n"
        self.assertEqual(
            parse_env(text),
            {"TOKEN": "abc==", "DB_URL": "postgres://h/db?sslmode=require", "EXPR": "a=b"},
        )

    def test_empty_value(self):
        self.assertEqual(parse_line("EMPTY="), ("EMPTY", ""))

    def test_missing_equals(self):
        with self.assertRaises(ValueError):
            parse_line("JUSTAKEY")
