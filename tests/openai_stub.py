"""A small OpenAI-compatible HTTP server for tests (http.server in a thread on 127.0.0.1).

Usage::

    def handler(request_json):            # the POST /v1/chat/completions body
        return "the assistant text"       # or a list of texts (several choices), or
                                          # Reply(status=500) / Reply(texts=[...], delay=2.0)
    with OpenAIStub(handler) as stub:
        ChatClient(stub.url, "m")...      # stub.url == "http://127.0.0.1:PORT/v1"
        stub.requests                     # every chat request body received, in order
        stub.count                        # number of chat requests

The handler's return value: a ``str`` (one choice; ``n`` copies when the request asks for
``n`` and ``honour_n``), a list of ``str`` (those choices), a :class:`Reply` (status code,
texts, delay, raw body) or a ``dict`` (sent as the JSON body as is). ``delay`` (seconds,
server-wide) sleeps before every chat reply. GET /v1/models lists ``models``.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass
class Reply:
    """A scripted reply: ``status`` (200: a completion with ``texts``; other: an error body),
    ``delay`` seconds before answering, ``body`` to send raw bytes instead."""

    texts: list[str] = field(default_factory=list)
    status: int = 200
    delay: float = 0.0
    body: bytes | None = None
    finish_reason: str = "stop"


def completion_body(texts: list[str], model: str = "stub", finish_reason: str = "stop",
                    prompt_tokens: int = 10) -> dict:
    """An OpenAI ``chat.completion`` object with one choice per text."""
    return {"id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": finish_reason}
                        for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sum(max(1, len(t) // 4) for t in texts),
                      "total_tokens": prompt_tokens + sum(max(1, len(t) // 4) for t in texts)}}


class OpenAIStub:
    """The server; see the module docstring. ``honour_n``: answer ``n`` choices when asked
    (False mimics servers that ignore ``n``)."""

    def __init__(self, handler: Callable[[dict], object], delay: float = 0.0, models=("stub",),
                 honour_n: bool = True):
        self.handler, self.delay, self.models, self.honour_n = handler, delay, list(models), honour_n
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        stub = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (time-out)

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    data = {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "stub"}
                                                       for m in stub.models]}
                    self._send(200, json.dumps(data).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._send(404, b'{"error": {"message": "not found"}}')
                    return
                try:
                    req = json.loads(raw)
                except ValueError:
                    self._send(400, b'{"error": {"message": "bad json"}}')
                    return
                with stub._lock:
                    stub.requests.append(req)
                if stub.delay:
                    time.sleep(stub.delay)
                try:
                    out = stub.handler(req)
                except Exception as e:  # noqa: BLE001 - a broken test handler is a 500, visible to the test
                    out = Reply(status=500, body=json.dumps({"error": {"message": f"handler: {e}"}}).encode())
                n = int(req.get("n") or 1)
                if isinstance(out, Reply):
                    if out.delay:
                        time.sleep(out.delay)
                    if out.body is not None:
                        self._send(out.status, out.body)
                    elif out.status != 200:
                        self._send(out.status, json.dumps({"error": {"message": f"stub status {out.status}",
                                                                     "type": "server_error"}}).encode())
                    else:
                        self._send(200, json.dumps(completion_body(out.texts, req.get("model", "stub"),
                                                                   out.finish_reason)).encode())
                    return
                if isinstance(out, dict):
                    self._send(200, json.dumps(out).encode())
                    return
                texts = [out] * (n if stub.honour_n else 1) if isinstance(out, str) else list(out)
                self._send(200, json.dumps(completion_body(texts, req.get("model", "stub"))).encode())

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """Base URL for the openai client (``http://127.0.0.1:PORT/v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def start(self) -> "OpenAIStub":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "OpenAIStub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def closed_port() -> int:
    """A local TCP port with nothing listening (bound, then released)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


__all__ = ["OpenAIStub", "Reply", "completion_body", "closed_port"]
