"""The HTTP handler: the core/v1 pod endpoints (create, get, list, watch, delete,
deletecollection, log, exec), discovery (`/version`, `/api`, `/api/v1`), and the stand-in's own
`/standin/faults` and `/standin/stats`. Errors are metav1.Status objects with the code the
apiserver uses; injected faults are answered before routing."""

import json
import re
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler

from api_status import INJECTABLE_REASONS, ApiError, bad_request, failure_status, to_json
from exec_session import check_upgrade, negotiate, parse_exec_options, run_exec, accept_key
from label_selectors import parse_field_selector, parse_label_selector
from watch_stream import serve_watch

MAX_BODY = 16 * 1024 * 1024
_POD_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(?:/(exec|log|status))?)?$")

VERSION = {
    "major": "1", "minor": "31", "gitVersion": "v1.31.0-swerve-k8s-standin", "gitCommit": "",
    "gitTreeState": "clean", "buildDate": "2024-08-13T00:00:00Z", "goVersion": "go1.22.5",
    "compiler": "gc", "platform": "linux/amd64",
}
API_VERSIONS = {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
API_RESOURCES = {
    "kind": "APIResourceList", "groupVersion": "v1",
    "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "shortNames": ["po"],
         "verbs": ["create", "delete", "deletecollection", "get", "list", "watch"]},
        {"name": "pods/exec", "singularName": "", "namespaced": True, "kind": "PodExecOptions", "verbs": ["create", "get"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
    ],
}


def _list_item(pod):
    return {k: v for k, v in pod.items() if k not in ("kind", "apiVersion")}


def _grace(query, body):
    value = (query.get("gracePeriodSeconds") or [None])[-1]
    if value is None and isinstance(body, dict):
        value = body.get("gracePeriodSeconds")
    if value is None:
        return None
    try:
        grace = int(value)
    except (TypeError, ValueError):
        raise bad_request(f"gracePeriodSeconds {value!r} is not an integer")
    if grace < 0:
        raise bad_request(f"gracePeriodSeconds {grace} is negative")
    return grace


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "swerve-k8s-standin"
    # Set on the class by standin.py: the PodStore, the Faults and the options.
    store = None
    faults = None
    verbose = False

    def log_message(self, fmt, *args):
        if self.verbose:
            super().log_message(fmt, *args)

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_DELETE(self):
        self._serve("DELETE")

    def do_PUT(self):
        self._serve("PUT")

    def do_PATCH(self):
        self._serve("PATCH")

    # --- plumbing ------------------------------------------------------------------------

    def _answer(self, code, body, headers=None, content_type="application/json"):
        data = to_json(body) if not isinstance(body, bytes) else body
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
                if len(data) > MAX_BODY:
                    raise ApiError(413, "RequestEntityTooLarge", f"request body over {MAX_BODY} bytes")
            return data
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ApiError(413, "RequestEntityTooLarge", f"request body of {length} bytes is over {MAX_BODY}")
        return self.rfile.read(length) if length else b""

    def _json_body(self, required):
        raw = self._read_body()
        if not raw:
            if required:
                raise bad_request("the request has no body; expected a JSON object")
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad_request(f"the request body is not JSON: {e}")

    def _serve(self, method):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        try:
            if not url.path.startswith("/standin/"):
                rule = self.faults.http_fault(method, url.path)
                if rule is not None:
                    self._read_body()
                    self._inject(rule)
                    return
            self._route(method, url.path, query)
        except ApiError as e:
            self._answer(e.code, e.status(), e.headers)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # a stand-in bug: a 500 naming it, not a dropped connection
            print(f"k8s stand-in: {method} {self.path}: {e!r}", file=sys.stderr, flush=True)
            self.close_connection = True
            try:
                self._answer(500, failure_status(500, "InternalError", f"k8s stand-in error: {e!r}"))
            except OSError:
                pass

    def _inject(self, rule):
        reason, message = INJECTABLE_REASONS[rule["status"]]
        details = None
        headers = {}
        if rule["status"] == 429:
            headers["Retry-After"] = str(rule["retry_after"])
            details = {"retryAfterSeconds": rule["retry_after"]}
        status = failure_status(rule["status"], reason, message + " (injected by the k8s stand-in)", details)
        self._answer(rule["status"], status, headers)

    # --- routes --------------------------------------------------------------------------

    def _route(self, method, path, query):
        if path.startswith("/standin/"):
            return self._standin(method, path)
        simple = {"/version": VERSION, "/api": API_VERSIONS, "/api/v1": API_RESOURCES}
        if method == "GET" and path.rstrip("/") in simple:
            return self._answer(200, simple[path.rstrip("/")])
        if method == "GET" and path in ("/healthz", "/readyz", "/livez"):
            return self._answer(200, b"ok", content_type="text/plain")
        if path == "/api/v1/pods":
            if method != "GET":
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on /api/v1/pods")
            return self._list_or_watch(None, query)
        match = _POD_PATH.match(path)
        if not match:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        namespace, name, sub = match.groups()
        if name is None:
            return self._collection(method, namespace, query)
        if sub == "exec" and method in ("GET", "POST"):
            return self._exec(namespace, name, query)
        if sub == "log" and method == "GET":
            return self._log(namespace, name)
        if sub in (None, "status") and method == "GET":
            return self._answer(200, self.store.get(namespace, name))
        if sub is None and method == "DELETE":
            body = self._json_body(required=False)
            return self._answer(200, self.store.delete(namespace, name, _grace(query, body)))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def _collection(self, method, namespace, query):
        if method == "POST":
            created = self.store.create(namespace, self._json_body(required=True))
            return self._answer(201, created)
        if method == "GET":
            return self._list_or_watch(namespace, query)
        if method == "DELETE":
            body = self._json_body(required=False)
            grace = _grace(query, body)
            items, _ = self._matching(namespace, query)
            deleted = []
            for pod in items:
                try:
                    deleted.append(self.store.delete(namespace, pod["metadata"]["name"], grace))
                except ApiError:
                    pass  # deleted by someone else meanwhile
            _, rv = self.store.list(namespace, lambda p: False)
            return self._answer(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
                                      "items": [_list_item(p) for p in deleted]})
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on pods")

    def _selectors(self, query):
        labels = parse_label_selector((query.get("labelSelector") or [""])[-1])
        fields = parse_field_selector((query.get("fieldSelector") or [""])[-1])
        return lambda pod: labels(pod["metadata"].get("labels") or {}) and fields(pod)

    def _matching(self, namespace, query):
        return self.store.list(namespace, self._selectors(query))

    def _list_or_watch(self, namespace, query):
        if (query.get("watch") or ["false"])[-1].lower() in ("true", "1"):
            return serve_watch(self, namespace, query, self._selectors(query))
        items, rv = self._matching(namespace, query)
        self._answer(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
                           "items": [_list_item(p) for p in items]})

    def _log(self, namespace, name):
        pod = self.store.get(namespace, name)
        record = self.store.records.get((namespace, name))
        container_id = record.container_id if record else None
        if not container_id:
            raise bad_request(f'container "{pod["spec"]["containers"][0]["name"]}" in pod "{name}" is waiting to start: {pod["status"]["phase"]}')
        out = self.store.docker(["logs", container_id], timeout=60)
        self._answer(200, out.stdout.encode() + out.stderr.encode(), content_type="text/plain")

    def _exec(self, namespace, name, query):
        options = parse_exec_options(query)
        container_id = self.store.exec_target(namespace, name, options["container"])
        check_upgrade(self.headers)
        protocol = negotiate(self.headers)
        self._read_body()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept_key(self.headers["Sec-WebSocket-Key"]))
        if protocol:
            self.send_header("Sec-WebSocket-Protocol", protocol)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        drop = self.faults.next_exec()
        run_exec(self.rfile, self.connection, protocol, options, container_id, self.store.docker_cli, drop)

    def _standin(self, method, path):
        if path == "/standin/stats" and method == "GET":
            with self.store.cond:
                pods = len(self.store.records)
            return self._answer(200, self.faults.stats(pods))
        if path == "/standin/faults" and method == "POST":
            try:
                self.faults.add(self._json_body(required=True))
            except ValueError as e:
                raise bad_request(str(e))
            return self._answer(200, self.faults.stats(None))
        if path == "/standin/faults" and method == "DELETE":
            self.faults.clear()
            return self._answer(200, self.faults.stats(None))
        raise ApiError(404, "NotFound", f"no stand-in endpoint {method} {path}")

