"""Aggregate ledger entries for the monthly report."""


def signed_amount(entry):
    """Refunds count against the total; everything else counts for it."""
    return -entry["amount"] if entry.get("refund") else entry["amount"]


def totals_by_category(entries):
    """Return {category: net amount}, refunds subtracted."""
    totals = {}
    for entry in entries:
        amount = signed_amount(entry)
        category = entry["category"]
        totals[category] = totals.get(category, 0) + amount
    return totals


def net_total(entries):
    """Return the net amount over all entries."""
    return sum(signed_amount(e) for e in entries)
