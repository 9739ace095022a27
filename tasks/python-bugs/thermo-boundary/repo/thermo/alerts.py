"""Classify temperature readings for frost and heat alerts."""

FREEZING_C = 0.0
HOT_C = 30.0


def to_celsius(fahrenheit):
    """Convert degrees Fahrenheit to Celsius."""
    return (fahrenheit - 32) * 5 / 9


def classify(celsius):
    """Return 'frost' at or below FREEZING_C, 'heat' at or above HOT_C,
    otherwise 'normal'."""
    if celsius < FREEZING_C:
        return "frost"
    if celsius >= HOT_C:
        return "heat"
    return "normal"


def alerts(readings_f):
    """Return (reading, kind) for each Fahrenheit reading that is not normal."""
    result = []
    for f in readings_f:
        kind = classify(to_celsius(f))
        if kind != "normal":
            result.append((f, kind))
    return result
