"""Combine stock counts reported by several warehouses."""


def merge_counts(*reports):
    """Return the total quantity per SKU across all ``reports``.

    Each report maps SKU -> quantity. Inputs are not modified.
    """
    merged = {}
    for report in reports:
        for sku, qty in report.items():
            merged[sku] = merged.get(sku, 0) + qty
    return merged


def low_stock(counts, threshold=5):
    """Return the SKUs whose quantity is below ``threshold``, sorted."""
    return sorted(sku for sku, qty in counts.items() if qty < threshold)
