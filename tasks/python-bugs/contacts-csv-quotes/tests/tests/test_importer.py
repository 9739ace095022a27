import unittest

from contacts.importer import Contact, parse_contacts


class ParseContactsTests(unittest.TestCase):
    def test_simple(self):
        text = "name,email,company\nAnn,ann@example.com,Initech\n"
        self.assertEqual(parse_contacts(text), [Contact("Ann", "ann@example.com", "Initech")])

    def test_quoted_commas(self):
        text = 'name,email,company\n"Doe, Jane",jane@example.com,"Acme, Inc."\n'
        self.assertEqual(parse_contacts(text), [Contact("Doe, Jane", "jane@example.com", "Acme, Inc.")])

    def test_escaped_quotes(self):
        text = 'name,email,company\n"Bob ""Bobby"" Lee",bob@example.com,\n'
        self.assertEqual(parse_contacts(text), [Contact('Bob "Bobby" Lee', "bob@example.com", "")])

    def test_blank_lines_and_whitespace(self):
        text = "Name, Email\n\n  Ann , ann@example.com \n   \nBen,ben@example.com\n"
        self.assertEqual(
            parse_contacts(text),
            [Contact("Ann", "ann@example.com"), Contact("Ben", "ben@example.com")],
        )

    def test_empty(self):
        self.assertEqual(parse_contacts(""), [])
