"""Prepare recipient lists for a newsletter."""


def normalize_email(address):
    """Lowercase and trim an address."""
    return address.strip().lower()


def recipient_list(addresses):
    """Return normalized addresses without duplicates or blanks.

    The order of first appearance is kept: the mailer sends in batches and
    people who signed up first must be mailed first.
    """
    cleaned = [normalize_email(a) for a in addresses if a.strip()]
    return list(set(cleaned))
