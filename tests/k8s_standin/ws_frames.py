"""The server side of RFC 6455 websockets: the opening handshake's accept key, reading masked
client frames (fragmented messages reassembled, control frames between fragments), writing
unmasked server frames, ping/pong and the closing handshake."""

import base64
import hashlib
import struct
import threading

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_TOO_BIG = 1009

# Larger client messages are refused with 1009 rather than buffered without bound.
MAX_MESSAGE = 64 * 1024 * 1024


def accept_key(client_key):
    digest = hashlib.sha1((client_key.strip() + GUID).encode()).digest()
    return base64.b64encode(digest).decode()


class ProtocolError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class ConnectionClosed(Exception):
    """The peer sent a close frame (code, or None when it carried none) or the TCP stream
    ended."""

    def __init__(self, code=None, reason=""):
        super().__init__(f"websocket closed ({code}) {reason}")
        self.code = code


def _read_exact(stream, n):
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise ConnectionClosed(None, "connection ended mid-frame")
        data += chunk
    return data


class WebSocket:
    """One upgraded connection: `stream` is the buffered reader the HTTP server parsed the
    request from (it may already hold the first frames), `sock` the socket to write to."""

    def __init__(self, stream, sock):
        self.stream = stream
        self.sock = sock
        self.write_lock = threading.Lock()
        self.close_sent = False

    def _read_frame(self):
        b0, b1 = _read_exact(self.stream, 2)
        fin, rsv, opcode = b0 & 0x80, b0 & 0x70, b0 & 0x0F
        masked, length = b1 & 0x80, b1 & 0x7F
        if rsv:
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, "reserved bits set without an extension")
        if not masked:
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, "client frame not masked")
        if length == 126:
            (length,) = struct.unpack(">H", _read_exact(self.stream, 2))
        elif length == 127:
            (length,) = struct.unpack(">Q", _read_exact(self.stream, 8))
        if opcode >= 0x8 and (length > 125 or not fin):
            raise ProtocolError(CLOSE_PROTOCOL_ERROR, "control frame fragmented or over 125 bytes")
        if length > MAX_MESSAGE:
            raise ProtocolError(CLOSE_TOO_BIG, f"frame of {length} bytes")
        mask = _read_exact(self.stream, 4)
        payload = bytearray(_read_exact(self.stream, length))
        for i in range(length):
            payload[i] ^= mask[i & 3]
        return bool(fin), opcode, bytes(payload)

    def receive(self):
        """The next data message as (opcode, payload); pings are answered here, a close frame
        is answered and raised as ConnectionClosed."""
        message_opcode, parts, size = None, [], 0
        while True:
            fin, opcode, payload = self._read_frame()
            if opcode == OP_PING:
                self.send(OP_PONG, payload)
                continue
            if opcode == OP_PONG:
                continue
            if opcode == OP_CLOSE:
                code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                self.close(CLOSE_NORMAL if code is None else code)
                raise ConnectionClosed(code, payload[2:].decode("utf-8", "replace"))
            if opcode == OP_CONTINUATION:
                if message_opcode is None:
                    raise ProtocolError(CLOSE_PROTOCOL_ERROR, "continuation without a message")
            elif opcode in (OP_TEXT, OP_BINARY):
                if message_opcode is not None:
                    raise ProtocolError(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
                message_opcode = opcode
            else:
                raise ProtocolError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode}")
            parts.append(payload)
            size += len(payload)
            if size > MAX_MESSAGE:
                raise ProtocolError(CLOSE_TOO_BIG, f"message over {MAX_MESSAGE} bytes")
            if fin:
                return message_opcode, b"".join(parts)

    def send(self, opcode, payload=b""):
        header = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            header += bytes([n])
        elif n < 1 << 16:
            header += bytes([126]) + struct.pack(">H", n)
        else:
            header += bytes([127]) + struct.pack(">Q", n)
        with self.write_lock:
            if self.close_sent and opcode != OP_CLOSE:
                raise ConnectionClosed(None, "close already sent")
            self.sock.sendall(header + payload)

    def close(self, code=CLOSE_NORMAL, reason=""):
        """Sends the close frame once; errors writing to a gone peer are ignored."""
        with self.write_lock:
            if self.close_sent:
                return
            self.close_sent = True
        try:
            self.send(OP_CLOSE, struct.pack(">H", code) + reason.encode()[:120])
        except OSError:
            pass
