"""Retry flaky operations a limited number of times."""

import time


class TransientError(Exception):
    """An error that may go away if the operation is tried again."""


def call_with_retry(func, attempts=3, delay=0.0, sleep=time.sleep):
    """Call ``func()`` until it succeeds, at most ``attempts`` times.

    Only TransientError triggers a retry; any other exception propagates
    immediately. If every attempt fails, the last TransientError is raised.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    last_error = None
    for attempt in range(attempts):
        try:
            return func()
        except TransientError as exc:
            last_error = exc
            if attempt + 1 < attempts:
                sleep(delay)
    raise last_error
