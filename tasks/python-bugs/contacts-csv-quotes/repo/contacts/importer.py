"""Import contacts exported from a spreadsheet as CSV text."""

from dataclasses import dataclass


@dataclass
class Contact:
    name: str
    email: str
    company: str = ""


def parse_contacts(text):
    """Parse CSV ``text`` that starts with a ``name,email,company`` header.

    Fields follow normal CSV rules (quoted fields may contain commas).
    Blank lines are skipped and whitespace around fields is stripped.
    """
    rows = [line.split(",") for line in text.splitlines() if line.strip()]
    if not rows:
        return []
    header = [h.strip().lower() for h in rows[0]]
    contacts = []
    for row in rows[1:]:
        record = dict(zip(header, (cell.strip() for cell in row)))
        contacts.append(Contact(record["name"], record["email"], record.get("company", "")))
    return contacts
