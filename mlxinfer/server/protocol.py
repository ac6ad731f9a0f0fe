"""The HTTP/1.1 connection: uvicorn's h11 protocol, with the 400 it sends itself in OpenAI's error shape.

A request h11 cannot parse (a Content-Length of `abc` or `-5`, a chunk that is no chunk after
`Transfer-Encoding: chunked`) never reaches the app: uvicorn answers it with a plain-text 400. Here
that answer is {"error": {...}} like every other, so a client's error handling reads one shape.
A request with both Content-Length and Transfer-Encoding: chunked is read as chunked, as RFC 9112
says, and reaches the app; one whose client stops sending before its body is whole (its "chunked"
body no chunks, say) is answered that 400 too, where uvicorn closed the connection without a word.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import error_body


class OpenAIShapedH11(H11Protocol):
    def eof_received(self):
        if self.conn.their_state is h11.SEND_BODY:  # the client stopped sending with its body cut short
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
