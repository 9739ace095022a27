import unittest

from netutil.retry import TransientError, call_with_retry


def flaky(failures, result="ok", error=TransientError):
    calls = []

    def func():
        calls.append(1)
        if len(calls) <= failures:
            raise error(f"failure {len(calls)}")
        return result

    return func, calls


class RetryTests(unittest.TestCase):
    def test_succeeds_after_retries(self):
        func, calls = flaky(2)
        self.assertEqual(call_with_retry(func, attempts=3, sleep=lambda s: None), "ok")
        self.assertEqual(len(calls), 3)

    def test_last_error_is_raised(self):
        func, calls = flaky(10)
        with self.assertRaises(TransientError) as ctx:
            call_with_retry(func, attempts=3, sleep=lambda s: None)
        self.assertEqual(str(ctx.exception), "failure 3")
        self.assertEqual(len(calls), 3)

    def test_other_errors_propagate_immediately(self):
        func, calls = flaky(5, error=KeyError)
        with self.assertRaises(KeyError):
            call_with_retry(func, attempts=3, sleep=lambda s: None)
        self.assertEqual(len(calls), 1)

    def test_sleeps_between_attempts(self):
        func, _ = flaky(10)
        slept = []
        with self.assertRaises(TransientError):
            call_with_retry(func, attempts=4, delay=0.5, sleep=slept.append)
        self.assertEqual(slept, [0.5, 0.5, 0.5])

    def test_invalid_attempts(self):
        with self.assertRaises(ValueError):
            call_with_retry(lambda: 1, attempts=0)
