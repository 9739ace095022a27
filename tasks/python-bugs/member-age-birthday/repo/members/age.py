"""Age calculations for the membership database."""

import datetime as dt


def age_on(birth_date, today):
    """Return the age in whole years on ``today`` of someone born on ``birth_date``."""
    return today.year - birth_date.year


def is_adult(birth_date, today=None, adult_age=18):
    """True when the person is at least ``adult_age`` years old on ``today``."""
    today = today or dt.date.today()
    return age_on(birth_date, today) >= adult_age
