"""`watch=true`: a chunked stream of newline-separated WatchEvents (ADDED, MODIFIED, DELETED;
ERROR with a 410 Expired Status when `resourceVersion` is older than the history), ended after
`timeoutSeconds`. Without a resourceVersion (or "0") the stream opens with an ADDED event per
matching pod, as the apiserver's watch from "any" version does."""

import json
import time

from api_status import ApiError, bad_request, failure_status

WATCH_DEFAULT_TIMEOUT_S = 1800


def watch_deadline(query):
    value = (query.get("timeoutSeconds") or [""])[-1]
    if not value:
        return time.monotonic() + WATCH_DEFAULT_TIMEOUT_S
    try:
        seconds = int(value)
    except ValueError:
        raise bad_request(f"timeoutSeconds {value!r} is not an integer")
    return time.monotonic() + max(seconds, 0)


def _start_version(query):
    value = (query.get("resourceVersion") or [""])[-1]
    if value in ("", "0"):
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(f"resourceVersion {value!r} is not a valid resource version")


def _chunk(handler, event):
    line = json.dumps(event, separators=(",", ":")).encode() + b"\n"
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
    handler.wfile.flush()


def serve_watch(handler, namespace, query, matches):
    store = handler.store
    deadline = watch_deadline(query)
    start = _start_version(query)
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()

    def relevant(pod):
        return (namespace is None or pod["metadata"]["namespace"] == namespace) and matches(pod)

    try:
        if start is None:
            items, rv = store.list(namespace, matches)
            last = int(rv)
            for pod in items:
                _chunk(handler, {"type": "ADDED", "object": pod})
        else:
            last = start
        while True:
            try:
                events = store.events_after(last)
            except ApiError as e:
                _chunk(handler, {"type": "ERROR", "object": failure_status(e.code, e.reason, e.message)})
                break
            for version, kind, pod in events:
                last = version
                if relevant(pod):
                    _chunk(handler, {"type": kind, "object": pod})
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with store.cond:
                if store.resource_version <= last:
                    store.cond.wait(timeout=min(remaining, 5.0))
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        pass
    handler.close_connection = True
