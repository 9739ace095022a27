"""Deterministic fault injection: HTTP answers (409/429/500/503) for the next N requests that
match a method and a path pattern, and dropped exec websockets (the Kth session, cut before or
after its output), with counts of what was injected so tests can assert that retries happened.

Rules come from `--fault` / `--drop-exec` flags and `POST /standin/faults`:
    {"http": [{"method": "POST", "path": "^/api/v1/namespaces/[^/]+/pods$", "status": 429,
               "count": 2, "retry_after": 1}],
     "exec_drops": [{"session": 3, "when": "after_output"}]}
`DELETE /standin/faults` clears the rules (not the counts); `GET /standin/stats` reports."""

import re
import threading

from api_status import INJECTABLE_REASONS

DROP_MODES = ("before_output", "after_output")


def _http_rule(spec, where):
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a rule is a JSON object, got {spec!r}")
    unknown = set(spec) - {"method", "path", "status", "count", "retry_after"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
    status = spec.get("status")
    if status not in INJECTABLE_REASONS:
        raise ValueError(f"{where}: status {status!r} is not one of {sorted(INJECTABLE_REASONS)}")
    count = spec.get("count", 1)
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"{where}: count {count!r} is not a positive integer")
    try:
        path = re.compile(spec.get("path", ".*"))
    except re.error as e:
        raise ValueError(f"{where}: path {spec.get('path')!r} is not a regular expression: {e}")
    retry_after = spec.get("retry_after", 1)
    if not isinstance(retry_after, int) or retry_after < 0:
        raise ValueError(f"{where}: retry_after {retry_after!r} is not a non-negative integer")
    method = str(spec.get("method", "*")).upper()
    return {"method": method, "path": path, "status": status, "remaining": count,
            "retry_after": retry_after, "injected": 0}


def _drop_rule(spec, where):
    if not isinstance(spec, dict) or set(spec) - {"session", "when"}:
        raise ValueError(f"{where}: an exec drop is {{\"session\": K, \"when\": {'|'.join(DROP_MODES)}}}, got {spec!r}")
    session, when = spec.get("session"), spec.get("when", "before_output")
    if not isinstance(session, int) or session < 1:
        raise ValueError(f"{where}: session {session!r} is not a positive integer (1 = the first exec)")
    if when not in DROP_MODES:
        raise ValueError(f"{where}: when {when!r} is not one of {DROP_MODES}")
    return {"session": session, "when": when}


def parse_flag_fault(text):
    """`--fault METHOD:PATH_REGEX:STATUS:COUNT` (the regex may hold colons)."""
    method, rest = text.split(":", 1) if ":" in text else (text, "")
    parts = rest.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        raise ValueError(f"--fault {text!r}: expected METHOD:PATH_REGEX:STATUS:COUNT")
    return {"method": method, "path": parts[0], "status": int(parts[1]), "count": int(parts[2])}


def parse_flag_drop(text):
    """`--drop-exec K[:before_output|after_output]`."""
    session, _, when = text.partition(":")
    if not session.isdigit():
        raise ValueError(f"--drop-exec {text!r}: expected K[:before_output|after_output]")
    return {"session": int(session), "when": when or "before_output"}


class Faults:
    def __init__(self):
        self.lock = threading.Lock()
        self.http_rules = []
        self.drops = {}
        self.exec_sessions = 0
        self.requests = 0
        self.injected = {}
        self.exec_dropped = {mode: 0 for mode in DROP_MODES}

    def add(self, body, where="POST /standin/faults"):
        """Validates the whole body first: a bad rule adds none."""
        if not isinstance(body, dict) or set(body) - {"http", "exec_drops"}:
            raise ValueError(f"{where}: expected an object with \"http\" and/or \"exec_drops\" lists")
        http = [_http_rule(r, f"{where} http[{i}]") for i, r in enumerate(body.get("http", []))]
        drops = [_drop_rule(r, f"{where} exec_drops[{i}]") for i, r in enumerate(body.get("exec_drops", []))]
        with self.lock:
            self.http_rules += http
            for drop in drops:
                self.drops[drop["session"]] = drop["when"]

    def clear(self):
        with self.lock:
            self.http_rules = []
            self.drops = {}

    def http_fault(self, method, path):
        """The rule answering this request (its count taken), or None."""
        with self.lock:
            self.requests += 1
            for rule in self.http_rules:
                if rule["remaining"] > 0 and rule["method"] in ("*", method) and rule["path"].search(path):
                    rule["remaining"] -= 1
                    rule["injected"] += 1
                    key = str(rule["status"])
                    self.injected[key] = self.injected.get(key, 0) + 1
                    return rule
        return None

    def next_exec(self):
        """Counts an upgraded exec session; its drop mode or None."""
        with self.lock:
            self.exec_sessions += 1
            when = self.drops.pop(self.exec_sessions, None)
            if when:
                self.exec_dropped[when] += 1
            return when

    def stats(self, pods):
        with self.lock:
            return {
                "requests": self.requests,
                "injected": dict(self.injected),
                "rules": [
                    {"method": r["method"], "path": r["path"].pattern, "status": r["status"],
                     "remaining": r["remaining"], "injected": r["injected"]}
                    for r in self.http_rules
                ],
                "exec_sessions": self.exec_sessions,
                "exec_dropped": dict(self.exec_dropped),
                "pending_exec_drops": [{"session": k, "when": v} for k, v in sorted(self.drops.items())],
                "pods": pods,
            }
