"""Summaries for a list of numeric grades."""


def average(grades):
    """Return the mean grade, or None when there are no grades."""
    if not grades:
        return None
    return sum(grades) // len(grades)


def letter(score):
    """Map a 0-100 score to a letter grade."""
    for cutoff, name in ((90, "A"), (80, "B"), (70, "C"), (60, "D")):
        if score >= cutoff:
            return name
    return "F"


def summary(grades):
    """Return a dict with the mean and its letter grade."""
    mean = average(grades)
    return {"mean": mean, "letter": None if mean is None else letter(mean)}
