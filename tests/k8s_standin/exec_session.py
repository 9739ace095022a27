"""`pods/{name}/exec` over a websocket, as the apiserver and kubelet answer it: subprotocol
negotiation (v5/v4/v3/v2/v1 `channel.k8s.io`, their base64 forms), one message per chunk
prefixed with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize), an empty
message on the lowest output channel once the stream is up, the status on channel 3 (v4 and
v5: a metav1.Status JSON; older: the error's text, nothing on success), v5's close-stdin
message (255, 0), then a close frame. The command runs as `docker exec -i`."""

import base64
import json
import os
import socket
import subprocess
import threading

from api_status import ApiError, bad_request
from ws_frames import (
    OP_BINARY,
    OP_TEXT,
    ConnectionClosed,
    ProtocolError,
    WebSocket,
    accept_key,
)

STDIN, STDOUT, STDERR, STATUS, RESIZE = 0, 1, 2, 3, 4
CLOSE_SIGNAL = 255

# protocol -> (version, base64?)
PROTOCOLS = {
    "v5.channel.k8s.io": (5, False),
    "v4.channel.k8s.io": (4, False),
    "v4.base64.channel.k8s.io": (4, True),
    "v3.channel.k8s.io": (3, False),
    "v3.base64.channel.k8s.io": (3, True),
    "v2.channel.k8s.io": (2, False),
    "v2.base64.channel.k8s.io": (2, True),
    "channel.k8s.io": (1, False),
    "base64.channel.k8s.io": (1, True),
    "": (1, False),
}


def _flag(query, name):
    value = (query.get(name) or ["false"])[-1].lower()
    if value in ("true", "1"):
        return True
    if value in ("false", "0", ""):
        return False
    raise bad_request(f"invalid value for {name}: {value!r} (true, false, 1 or 0)")


def parse_exec_options(query):
    command = query.get("command") or []
    if not command:
        raise bad_request("you must specify at least 1 command")
    options = {name: _flag(query, name) for name in ("stdin", "stdout", "stderr", "tty")}
    if not (options["stdin"] or options["stdout"] or options["stderr"]):
        raise bad_request("you must specify at least one of stdin, stdout, stderr")
    options["command"] = command
    options["container"] = (query.get("container") or [""])[-1]
    return options


def negotiate(headers):
    """The subprotocol to answer with: the first the client offers that is supported; "" (v1)
    when it offers none."""
    offered = []
    for value in headers.get_all("Sec-WebSocket-Protocol") or []:
        offered += [p.strip() for p in value.split(",") if p.strip()]
    if not offered:
        return ""
    for protocol in offered:
        if protocol in PROTOCOLS:
            return protocol
    supported = sorted(p for p in PROTOCOLS if p)
    raise bad_request(f"requested protocol(s) are not supported: {offered}; supports {supported}")


def check_upgrade(headers):
    if headers.get("Upgrade", "").lower() != "websocket" or "upgrade" not in headers.get("Connection", "").lower():
        raise bad_request("Upgrade request required")
    if headers.get("Sec-WebSocket-Version", "") != "13":
        raise ApiError(426, "BadRequest", "websocket version 13 required", headers={"Sec-WebSocket-Version": "13"})
    if not headers.get("Sec-WebSocket-Key"):
        raise bad_request("websocket upgrade without Sec-WebSocket-Key")


def exit_status(version, code):
    """What channel 3 carries when the command ended with exit code `code` (None: nothing)."""
    if code == 0:
        return json.dumps({"metadata": {}, "status": "Success"}).encode() if version >= 4 else None
    message = f"command terminated with non-zero exit code: error executing command, exit code {code}"
    if version < 4:
        return message.encode()
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    ).encode()


class ExecSession:
    def __init__(self, ws, protocol, options, container_id, docker_cli):
        self.ws = ws
        self.version, self.base64 = PROTOCOLS[protocol]
        self.options = options
        self.container_id = container_id
        self.docker_cli = docker_cli
        self.client_gone = threading.Event()
        self.process = None

    def send(self, channel, data):
        if self.base64:
            self.ws.send(OP_TEXT, bytes([ord("0") + channel]) + base64.b64encode(data))
        else:
            self.ws.send(OP_BINARY, bytes([channel]) + data)

    def start(self):
        args = [self.docker_cli, "exec"]
        if self.options["stdin"]:
            args.append("-i")
        args += [self.container_id] + self.options["command"]
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if self.options["stdin"] else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        # The kubelet's signal that the stream is up: an empty message on the lowest output.
        first = STDOUT if self.options["stdout"] else STDERR if self.options["stderr"] else STATUS
        self.send(first, b"")

    def pump(self, pipe, channel, wanted):
        """Forwards one output pipe; output of a stream the client did not ask for is read and
        dropped (the process must not block on it)."""
        fd = pipe.fileno()
        while True:
            chunk = os.read(fd, 32768)
            if not chunk:
                return
            if wanted and not self.client_gone.is_set():
                try:
                    self.send(channel, chunk)
                except (OSError, ConnectionClosed):
                    self.client_gone.set()

    def _decode(self, opcode, payload):
        if not payload:
            return None, b""
        channel = payload[0]
        if self.base64:
            return channel - ord("0"), base64.b64decode(payload[1:])
        return channel, payload[1:]

    def read_client(self):
        """Client messages: stdin to the process, v5's close signal, resize ignored; ends when
        the client closes or the connection breaks."""
        stdin = self.process.stdin
        try:
            while True:
                channel, data = self._decode(*self.ws.receive())
                if channel == STDIN and stdin is not None and data:
                    try:
                        stdin.write(data)
                        stdin.flush()
                    except (BrokenPipeError, ValueError):
                        pass
                elif channel == CLOSE_SIGNAL and self.version >= 5 and data[:1] == bytes([STDIN]):
                    if stdin is not None:
                        stdin.close()
                        stdin = None
        except (ConnectionClosed, ProtocolError, OSError, ValueError) as e:
            if isinstance(e, ProtocolError):
                self.ws.close(e.code, str(e))
            self.client_gone.set()
            if self.process.poll() is None:
                # The client went away mid-command: its `docker exec` ends (the command in the
                # container may go on, as on a cluster when a client disconnects).
                self.process.kill()
            if stdin is not None:
                try:
                    stdin.close()
                except OSError:
                    pass


def hard_close(sock):
    """Drops the TCP connection without a websocket close (a broken network, an apiserver
    restart)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def run_exec(ws_stream, sock, protocol, options, container_id, docker_cli, drop):
    """Runs one upgraded exec session to its end. drop: None, "before_output" (the connection
    is cut before the command starts) or "after_output" (cut after the output, before the
    status)."""
    ws = WebSocket(ws_stream, sock)
    if drop == "before_output":
        hard_close(sock)
        return
    session = ExecSession(ws, protocol, options, container_id, docker_cli)
    session.start()
    reader = threading.Thread(target=session.read_client, daemon=True)
    reader.start()
    pumps = [
        threading.Thread(target=session.pump, args=(session.process.stdout, STDOUT, options["stdout"]), daemon=True),
        threading.Thread(target=session.pump, args=(session.process.stderr, STDERR, options["stderr"]), daemon=True),
    ]
    for pump in pumps:
        pump.start()
    for pump in pumps:
        pump.join()
    code = session.process.wait()
    if drop == "after_output":
        hard_close(sock)
        return
    if not session.client_gone.is_set():
        try:
            status = exit_status(session.version, code)
            if status is not None:
                session.send(STATUS, status)
            ws.close()
        except (OSError, ConnectionClosed):
            pass
    reader.join(timeout=5)
    hard_close(sock)
