"""Due-date arithmetic for invoices."""

import datetime as dt


def add_months(day, months):
    """Return ``day`` moved by ``months`` calendar months.

    When the target month is shorter, the result is clamped to its last day
    (Jan 31 + 1 month -> Feb 28, or Feb 29 in a leap year).
    """
    index = day.month - 1 + months
    year = day.year + index // 12
    month = index % 12 + 1
    return day.replace(year=year, month=month)


def due_date(issued, net_days=30):
    """Return the date an invoice issued on ``issued`` is due."""
    return issued + dt.timedelta(days=net_days)


def next_billing_dates(start, count):
    """Return the next ``count`` monthly billing dates after ``start``."""
    return [add_months(start, i) for i in range(1, count + 1)]
