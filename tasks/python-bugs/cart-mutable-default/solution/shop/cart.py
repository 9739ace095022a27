"""A minimal shopping cart."""


class Cart:
    """Holds (sku, quantity, unit_price) lines for one customer."""

    def __init__(self, lines=None):
        self.lines = list(lines) if lines else []

    def add(self, sku, quantity=1, unit_price=0.0):
        """Add ``quantity`` of ``sku``, merging with an existing line."""
        for i, (s, q, p) in enumerate(self.lines):
            if s == sku:
                self.lines[i] = (s, q + quantity, p)
                return
        self.lines.append((sku, quantity, unit_price))

    def total(self):
        """Return the cart value rounded to cents."""
        return round(sum(q * p for _, q, p in self.lines), 2)

    def __len__(self):
        return sum(q for _, q, _ in self.lines)
