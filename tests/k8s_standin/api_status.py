"""metav1.Status answers and the small helpers every part of the stand-in shares."""

import datetime
import json


class ApiError(Exception):
    """An error answered as a metav1.Status with an HTTP status code."""

    def __init__(self, code, reason, message, details=None, headers=None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers = headers or {}

    def status(self):
        return failure_status(self.code, self.reason, self.message, self.details)


def failure_status(code, reason, message, details=None):
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        status["details"] = details
    return status


def not_found(name):
    return ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})


def already_exists(name):
    return ApiError(
        409, "AlreadyExists", f'pods "{name}" already exists', {"name": name, "kind": "pods"}
    )


def bad_request(message):
    return ApiError(400, "BadRequest", message)


def invalid(name, causes):
    """422 Invalid: causes are (field, cause reason, message) triples, as the apiserver's
    field validation reports them."""
    listed = "; ".join(f"{field}: {message}" for field, _, message in causes)
    return ApiError(
        422,
        "Invalid",
        f'Pod "{name}" is invalid: {listed}',
        {
            "name": name,
            "kind": "Pod",
            "causes": [
                {"reason": reason, "message": message, "field": field}
                for field, reason, message in causes
            ],
        },
    )


# The reason a client sees for each status code the fault injector can answer with.
INJECTABLE_REASONS = {
    409: ("Conflict", "the object has been modified; please apply your changes to the latest version and try again"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    500: ("InternalError", "an error on the server (\"injected by the k8s stand-in\") has prevented the request from succeeding"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
}


def now_rfc3339():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_json(value):
    return json.dumps(value, separators=(",", ":")).encode()
