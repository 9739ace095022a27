"""The official `kubernetes` Python client against the k8s stand-in (tests/k8s_standin.rs):
the independent reference that the stand-in speaks the real core/v1 API. Argument: the
stand-in's base URL. Prints `checks passed` at the end."""

import base64
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid

from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

NAMESPACE = "swerve-selftest"
IMAGE = "swerve-test-python:1"


def check(condition, message):
    if not condition:
        raise AssertionError(message)
    print("ok:", message, flush=True)


def pod_body(name, labels, command, image=IMAGE, **spec):
    container = {"name": "main", "image": image, "command": command}
    container.update(spec.pop("container", {}))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": dict({"containers": [container], "restartPolicy": "Never"}, **spec)}


def watch_until(api, name, done, timeout=90):
    """Watches one pod (fieldSelector on its name) until done(pod) holds; returns the pod and
    the event types seen."""
    seen = []
    w = watch.Watch()
    for event in w.stream(api.list_namespaced_pod, NAMESPACE, field_selector=f"metadata.name={name}",
                          timeout_seconds=timeout):
        seen.append(event["type"])
        if done(event["object"], event["type"]):
            w.stop()
            return event["object"], seen
    raise AssertionError(f"pod {name}: watch ended before the condition held; events {seen}")


def expect_api_error(call, status, reason):
    try:
        call()
    except ApiException as e:
        body = json.loads(e.body)
        check(e.status == status and body["reason"] == reason and body["code"] == status and body["kind"] == "Status",
              f"answered {status} {reason}: {body['message']}")
        return e
    raise AssertionError(f"expected {status} {reason}, the call succeeded")


def run_exec(api, name, command, stdin=None):
    resp = stream(api.connect_get_namespaced_pod_exec, name, NAMESPACE, command=command, stderr=True,
                  stdin=stdin is not None, stdout=True, tty=False, _preload_content=False)
    if stdin is not None:
        resp.write_stdin(stdin)
    resp.run_forever(timeout=60)
    return resp.read_stdout(), resp.read_stderr(), resp.returncode


def exec_until_cut(api, name, command, when):
    """Output read before the connection broke, and whether a status came."""
    try:
        resp = stream(api.connect_get_namespaced_pod_exec, name, NAMESPACE, command=command, stderr=True,
                      stdin=False, stdout=True, tty=False, _preload_content=False)
    except Exception as e:  # cut before the client finished its handshake
        print(f"  ({when}: opening raised {type(e).__name__})")
        return "", False
    out = ""
    try:
        while resp.is_open():
            resp.update(timeout=30)
            out += resp.read_stdout(timeout=0) or ""
    except Exception as e:  # the client's own error for a connection cut under it
        print(f"  ({when}: the client raised {type(e).__name__})")
    out += resp.read_stdout(timeout=0) or ""
    return out, bool(resp.read_channel(3))


def standin(base, method, path, body=None):
    request = urllib.request.Request(base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(request) as answer:
        return json.loads(answer.read())


def check_lifecycle_and_exec(api, run, labels):
    main = f"main-{run}"
    created = api.create_namespaced_pod(NAMESPACE, pod_body(main, dict(labels, role="main"), ["sleep", "600"],
                                        container={"resources": {"limits": {"memory": "256Mi", "cpu": "500m"}}}))
    check(created.status.phase == "Pending" and created.metadata.uid, "created pod is Pending with a uid")
    pod, seen = watch_until(api, main, lambda p, t: p.status.phase == "Running")
    check(seen[0] == "ADDED" and pod.status.container_statuses[0].state.running is not None,
          f"watched to Running ({seen})")
    expect_api_error(lambda: api.create_namespaced_pod(NAMESPACE, pod_body(main, labels, ["true"])), 409, "AlreadyExists")
    expect_api_error(lambda: api.create_namespaced_pod(NAMESPACE, pod_body("noimage", labels, ["true"], image="")),
                     422, "Invalid")
    expect_api_error(lambda: api.read_namespaced_pod(f"absent-{run}", NAMESPACE), 404, "NotFound")

    out, err, code = run_exec(api, main, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    check((out, err, code) == ("out\n", "err\n", 3), f"exec: separate stdout and stderr, exit 3 ({out!r} {err!r} {code})")
    out, err, code = run_exec(api, main, ["sh", "-c", "read line; echo got:$line"], stdin="hello\n")
    check((out, code) == ("got:hello\n", 0), f"exec with stdin ({out!r} {code})")
    answer = stream(api.connect_get_namespaced_pod_exec, main, NAMESPACE, command=["echo", "preloaded"],
                    stderr=True, stdin=False, stdout=True, tty=False)
    check(answer == "preloaded\n", f"exec with the preloaded answer ({answer!r})")
    limit = run_exec(api, main, ["sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"])[0]
    check(limit.strip() == str(256 * 1024 * 1024), f"memory limit in the container's cgroup ({limit.strip()})")
    nets = run_exec(api, main, ["ls", "/sys/class/net"])[0]
    check(nets.split() == ["lo"], f"no network but loopback ({nets.split()})")
    return main


def check_lists(api, run, labels):
    other = f"other-{run}"
    api.create_namespaced_pod(NAMESPACE, pod_body(other, dict(labels, role="other", extra="1"), ["sleep", "600"]))
    selector = f"swerve.test={run}"
    names = lambda pods: sorted(p.metadata.name for p in pods.items)  # noqa: E731
    check(names(api.list_namespaced_pod(NAMESPACE, label_selector=f"{selector},role=main")) == [f"main-{run}"], "label equality")
    check(names(api.list_namespaced_pod(NAMESPACE, label_selector=f"{selector},!extra")) == [f"main-{run}"], "label !key")
    check(names(api.list_namespaced_pod(NAMESPACE, label_selector=f"{selector},extra")) == [other], "label key")
    check(names(api.list_namespaced_pod(NAMESPACE, label_selector=f"{selector},role!=main")) == [other], "label !=")
    check(names(api.list_namespaced_pod(NAMESPACE, field_selector=f"metadata.name={other}")) == [other], "field selector")
    everywhere = api.list_pod_for_all_namespaces(label_selector=selector)
    check(names(everywhere) == sorted([f"main-{run}", other]) and everywhere.metadata.resource_version,
          "list across namespaces with a resourceVersion")


def check_endings(api, run, labels):
    for name, command, phase, reason, code in [(f"ok-{run}", ["true"], "Succeeded", "Completed", 0),
                                              (f"fail-{run}", ["sh", "-c", "exit 7"], "Failed", "Error", 7)]:
        api.create_namespaced_pod(NAMESPACE, pod_body(name, labels, command))
        pod, _ = watch_until(api, name, lambda p, t: p.status.phase in ("Succeeded", "Failed"))
        terminated = pod.status.container_statuses[0].state.terminated
        check(pod.status.phase == phase and terminated.reason == reason and terminated.exit_code == code,
              f"{name}: {phase}, terminated {reason} exit {code}")
    deadline = f"deadline-{run}"
    begun = time.monotonic()
    api.create_namespaced_pod(NAMESPACE, pod_body(deadline, labels, ["sleep", "600"], activeDeadlineSeconds=3))
    pod, _ = watch_until(api, deadline, lambda p, t: p.status.phase == "Failed")
    check(pod.status.reason == "DeadlineExceeded" and 3 <= time.monotonic() - begun < 30,
          f"activeDeadlineSeconds: Failed, DeadlineExceeded after {time.monotonic() - begun:.1f} s")
    absent = f"absent-image-{run}"
    api.create_namespaced_pod(NAMESPACE, pod_body(absent, labels, ["true"], image="swerve-test-absent:404"))
    reasons = []

    def backoff(p, t):
        waiting = p.status.container_statuses and p.status.container_statuses[0].state.waiting
        if waiting and waiting.reason not in reasons:
            reasons.append(waiting.reason)
        return "ImagePullBackOff" in reasons

    pod, _ = watch_until(api, absent, backoff)
    check(pod.status.phase == "Pending" and reasons[-2:] == ["ErrImagePull", "ImagePullBackOff"],
          f"missing image: Pending, {reasons}")


def check_faults(api, base, run, labels, main):
    standin(base, "DELETE", "/standin/faults")
    before = standin(base, "GET", "/standin/stats")
    standin(base, "POST", "/standin/faults", {"http": [
        {"method": "POST", "path": "/pods$", "status": 409, "count": 1},
        {"method": "DELETE", "path": "/pods/", "status": 500, "count": 1},
        {"method": "GET", "path": f"/pods/{main}$", "status": 503, "count": 1},
        {"method": "GET", "path": f"/pods/{main}$", "status": 429, "count": 1, "retry_after": 2}]})
    expect_api_error(lambda: api.create_namespaced_pod(NAMESPACE, pod_body(f"x-{run}", labels, ["true"])), 409, "Conflict")
    expect_api_error(lambda: api.delete_namespaced_pod(main, NAMESPACE), 500, "InternalError")
    expect_api_error(lambda: api.read_namespaced_pod(main, NAMESPACE), 503, "ServiceUnavailable")
    # urllib3 (under the client) retries a 429 that carries Retry-After, after sleeping that long.
    begun = time.monotonic()
    check(api.read_namespaced_pod(main, NAMESPACE).metadata.name == main and time.monotonic() - begun >= 2,
          f"a 429 with Retry-After: 2 retried by the client after {time.monotonic() - begun:.1f} s")
    stats = standin(base, "GET", "/standin/stats")
    injected = {k: v - before["injected"].get(k, 0) for k, v in stats["injected"].items()}
    check(injected == {"409": 1, "429": 1, "500": 1, "503": 1}, f"stats count the injected answers ({injected})")

    session = stats["exec_sessions"] + 1
    standin(base, "POST", "/standin/faults", {"exec_drops": [{"session": session, "when": "before_output"},
                                                             {"session": session + 1, "when": "after_output"}]})
    for when in ("before_output", "after_output"):
        out, status_seen = exec_until_cut(api, main, ["echo", "dropped"], when)
        check(not status_seen and (out == "dropped\n") == (when == "after_output"),
              f"exec websocket dropped {when}: output {out!r}, no status")
    dropped = standin(base, "GET", "/standin/stats")["exec_dropped"]
    check({k: v - before["exec_dropped"][k] for k, v in dropped.items()} == {"before_output": 1, "after_output": 1},
          "stats count the dropped exec websockets")


def _client_frame(opcode, payload, fin=True):
    mask = os.urandom(4)
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
    return head + mask + bytes(b ^ mask[i & 3] for i, b in enumerate(payload))


def _server_frames(sock):
    """(opcode, payload) of each server frame until the server's close frame."""
    stream = sock.makefile("rb")
    while True:
        b0, b1 = stream.read(2)
        assert not b1 & 0x80, "server frames are not masked"
        n = b1 & 0x7F
        if n == 126:
            n = struct.unpack(">H", stream.read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", stream.read(8))[0]
        payload = stream.read(n)
        yield b0 & 0x0F, payload
        if b0 & 0x0F == 0x8:
            return


def check_raw_websocket_v5(base, main):
    """v5.channel.k8s.io from raw frames: the handshake, a fragmented stdin message with a ping
    between its fragments, v5's close-stdin signal, the empty message on stdout that opens the
    stream, separate stdout and stderr, the status, the closing handshake."""
    host, port = base.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    key = base64.b64encode(os.urandom(16)).decode()
    command = "&".join("command=" + urllib.parse.quote(c) for c in ["sh", "-c", "cat; echo err >&2; exit 5"])
    sock.sendall((f"GET /api/v1/namespaces/{NAMESPACE}/pods/{main}/exec?{command}&stdin=true&stdout=true&stderr=true HTTP/1.1\r\n"
                  f"Host: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                  "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)}
    expected_accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    check(lines[0].startswith("HTTP/1.1 101") and headers["sec-websocket-accept"] == expected_accept
          and headers["sec-websocket-protocol"] == "v5.channel.k8s.io", f"websocket handshake: {lines[0]}, v5 chosen")
    sock.sendall(_client_frame(0x2, b"\x00he", fin=False) + _client_frame(0x9, b"p1")
                 + _client_frame(0x0, b"llo\n") + _client_frame(0x2, b"\xff\x00"))
    frames = list(_server_frames(sock))
    sock.sendall(_client_frame(0x8, struct.pack(">H", 1000)))
    sock.close()
    data = [p for op, p in frames if op == 0x2]
    check((0xA, b"p1") in frames, "a ping between fragments is answered with its pong")
    check(data[0] == b"\x01", "the stream opens with an empty stdout message")
    stdout = b"".join(p[1:] for p in data if p[0] == 1)
    stderr = b"".join(p[1:] for p in data if p[0] == 2)
    check((stdout, stderr) == (b"hello\n", b"err\n"), f"fragmented stdin, closed by v5's signal: {stdout!r} {stderr!r}")
    status = json.loads(b"".join(p[1:] for p in data if p[0] == 3))
    check(status["status"] == "Failure" and status["reason"] == "NonZeroExitCode"
          and status["details"]["causes"] == [{"reason": "ExitCode", "message": "5"}], f"v5 status: {status}")
    check(frames[-1][0] == 0x8 and struct.unpack(">H", frames[-1][1][:2])[0] == 1000, "a normal close frame ends it")


def check_deletion(api, run, main):
    answer = api.delete_namespaced_pod(main, NAMESPACE, grace_period_seconds=0)
    check(answer.metadata.name == main and answer.metadata.deletion_timestamp is not None,
          "delete answers with the pod, deletionTimestamp set")
    _, seen = watch_until(api, main, lambda p, t: t == "DELETED")
    check(seen[-1] == "DELETED", "watched to DELETED")
    expect_api_error(lambda: api.read_namespaced_pod(main, NAMESPACE), 404, "NotFound")
    left = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=swerve.k8s-standin.pod={NAMESPACE}/{main}"],
                          capture_output=True, text=True, check=True).stdout.split()
    check(left == [], "the deleted pod's container is removed")
    api.delete_collection_namespaced_pod(NAMESPACE, label_selector=f"swerve.test={run}", grace_period_seconds=0)
    deadline = time.monotonic() + 60
    while api.list_namespaced_pod(NAMESPACE, label_selector=f"swerve.test={run}").items:
        if time.monotonic() > deadline:
            raise AssertionError("deletecollection left pods behind")
        time.sleep(0.2)
    check(True, "deletecollection by label removed the rest")


def main():
    base = sys.argv[1]
    configuration = client.Configuration()
    configuration.host = base
    api = client.CoreV1Api(client.ApiClient(configuration))
    check(client.VersionApi(client.ApiClient(configuration)).get_code().git_version.startswith("v1."), "GET /version")
    run = uuid.uuid4().hex[:8]
    labels = {"swerve.test": run}
    main_pod = check_lifecycle_and_exec(api, run, labels)
    check_lists(api, run, labels)
    check_endings(api, run, labels)
    check_raw_websocket_v5(base, main_pod)
    check_faults(api, base, run, labels, main_pod)
    check_deletion(api, run, main_pod)
    print("checks passed", flush=True)


if __name__ == "__main__":
    main()
