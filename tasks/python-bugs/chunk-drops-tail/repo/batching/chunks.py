"""Split work into batches."""


def chunked(items, size):
    """Return ``items`` split into lists of ``size`` (the last may be shorter)."""
    if size < 1:
        raise ValueError("size must be >= 1")
    items = list(items)
    return [items[i:i + size] for i in range(0, len(items) - size, size)]


def batch_sizes(total, size):
    """Return the sizes of the batches ``chunked`` makes for ``total`` items."""
    return [len(batch) for batch in chunked(range(total), size)]
