"""Currency rounding for price calculations."""

from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")


def to_cents(amount):
    """Round ``amount`` (float, int, str or Decimal) to cents, halves away from zero.

    The amount is taken as the decimal number it is written as, so 2.675
    rounds to 2.68.
    """
    return Decimal(str(amount)).quantize(CENT, rounding=ROUND_HALF_UP)


def apply_discount(price, percent):
    """Return ``price`` reduced by ``percent`` percent, rounded to cents."""
    return to_cents(Decimal(str(price)) * (100 - Decimal(str(percent))) / 100)
