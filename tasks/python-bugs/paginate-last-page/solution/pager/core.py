"""Helpers for splitting a sequence of results into fixed-size pages."""


def page_count(total, per_page):
    """Return how many pages are needed to show ``total`` items.

    An empty result set has zero pages.
    """
    if per_page <= 0:
        raise ValueError("per_page must be positive")
    return (total + per_page - 1) // per_page


def get_page(items, page, per_page):
    """Return the items on ``page`` (1-based).

    Raises IndexError when ``page`` is outside ``1..page_count``.
    """
    pages = page_count(len(items), per_page)
    if page < 1 or page > pages:
        raise IndexError(f"page {page} out of range (1..{pages})")
    start = (page - 1) * per_page
    return items[start:start + per_page]
