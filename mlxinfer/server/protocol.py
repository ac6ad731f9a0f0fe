"""The HTTP/1.1 connection: uvicorn's h11 protocol, with the 400 it sends itself in OpenAI's error shape.

A request h11 cannot parse (a Content-Length of `abc` or `-5`, a chunk that is no chunk after
`Transfer-Encoding: chunked`) never reaches the app: uvicorn answers it with a plain-text 400. Here
that answer is {"error": {...}} like every other, so a client's error handling reads one shape.
A request with both Content-Length and Transfer-Encoding: chunked is read as chunked, as RFC 9112
says, and reaches the app; one whose client stops sending before its body is whole (its "chunked"
body no chunks, say) is answered that 400 too, where uvicorn closed the connection without a word.
Both, and the 408 for headers that never arrive whole, count in /metrics as the app's answers do.
"""

from __future__ import annotations

import json
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_body

HEADERS_TIMEOUT_S = 30.0  # a request's headers must be whole this long after its connection opens or its last answer
# what the kernel holds of a connection's output not yet sent: Linux grew its send buffer up to 4 MB, which hid
# a client that reads nothing for thousands of streamed tokens (stream.py's stall watch sees a client only once
# the buffers are full). TCP_NOTSENT_LOWAT bounds the unsent bytes alone, so a far client's data in flight is
# not capped; where it is missing, the send buffer is.
UNSENT_BYTES = 64 * 1024


class OpenAIShapedH11(H11Protocol):
    """Also: headers that do not arrive whole within HEADERS_TIMEOUT_S are a 408 and the connection closes.
    uvicorn has no such timeout: a connection that sent half a request line stayed open for ever, and ~2,000
    of them took every file descriptor, so that no one else could connect."""

    headers_timer = None
    timed_cycle = None  # the request (cycle) that was the last when the timer started

    def connection_made(self, transport):
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            if hasattr(socket, "TCP_NOTSENT_LOWAT"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, UNSENT_BYTES)
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNSENT_BYTES)
        self._await_headers()

    def on_response_complete(self):
        super().on_response_complete()
        self._await_headers()  # the next request's, on a connection kept alive

    def handle_events(self):
        super().handle_events()
        if self.headers_timer is not None and self.cycle is not self.timed_cycle:
            self.headers_timer.cancel()  # a request began: its headers are whole
            self.headers_timer = None

    def connection_lost(self, exc):
        if self.headers_timer is not None:
            self.headers_timer.cancel()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        if self.headers_timer is not None:
            self.headers_timer.cancel()
        self.timed_cycle = self.cycle
        self.headers_timer = self.loop.call_later(HEADERS_TIMEOUT_S, self._headers_too_slow, self.cycle)

    def _headers_too_slow(self, cycle) -> None:
        self.headers_timer = None
        busy = cycle is not None and not cycle.response_complete  # a pipelined request, begun as the last ended
        if self.cycle is not cycle or busy or self.transport.is_closing():
            return
        answered = self.conn.their_state is h11.SEND_BODY and self.conn.our_state is h11.DONE
        idle = cycle is not None and not self.conn.trailing_data[0]
        if answered or idle:
            # answered: the app answered a body that never came whole (its 408, or a 413) while the client kept
            # the connection (a second 408 followed the first); idle: a kept-alive connection with no byte of a
            # next request, closed as uvicorn's keep-alive timeout closes one, without an answer
            self.transport.close()
            return
        data = json.dumps(
            error_body(408, f"the request's headers did not arrive within {HEADERS_TIMEOUT_S:g} s; send them whole")
        ).encode()
        head = b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
        self.transport.write(head + b"content-length: %d\r\n\r\n" % len(data) + data)
        self.transport.close()
        self._count(408)

    def eof_received(self):
        # the client stopped sending with its body cut short, and nothing answered it yet (a 413 sent while the
        # body still came has: that connection only closes)
        if self.conn.their_state is h11.SEND_BODY and self.conn.our_state is h11.SEND_RESPONSE:
            self.conn.receive_data(b"")  # h11 reads the end: an error, answered by send_400_response
            self.handle_events()
            return True  # the transport stays open to write that answer (send_400_response closes it)
        return super().eof_received()

    def send_400_response(self, msg: str) -> None:
        data = json.dumps(error_body(400, f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})")).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            (b"connection", b"close"),
        ]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=data)):
            self.transport.write(self.conn.send(event))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()
        self._count(400)

    def _count(self, status: int) -> None:
        """An answer the app never saw, in /metrics (endpoint "other": its path was never read whole), where
        the app served is mlxinfer's (metrics.Counted): a slow or malformed client shows there too."""
        answered = getattr(getattr(self.config.app, "metrics", None), "answered", None)
        if answered is not None:
            answered("", status)
