"""A thin chat client over the official ``openai`` Python client, for any
OpenAI-compatible endpoint (vLLM, SGLang, llama.cpp server, ms-swift deploy, OpenAI).

Retries: the ``openai`` client itself retries connection errors and the statuses 408, 409,
429 and >= 500 with exponential backoff (0.5 s doubling, at most 8 s, honouring
``Retry-After``; ``openai._base_client.BaseClient._should_retry``); ``max_retries`` is
passed straight to it. Nothing here speaks HTTP by hand.

Errors: :class:`EndpointError` when the endpoint cannot be used at all (unreachable,
refused, authentication rejected), raised by :meth:`ChatClient.check` within about
``probe_timeout_s``; :class:`RequestError` when one request fails after its retries (time
limit, 4xx, malformed reply), which callers record as a failed case.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit


class EndpointError(RuntimeError):
    """The endpoint cannot be used (unreachable, connection refused, authentication rejected)."""


class RequestError(RuntimeError):
    """One chat request failed after its retries (time limit, HTTP error, malformed reply)."""


@dataclass(frozen=True)
class Completion:
    """One sampled answer: ``text`` (the assistant message content, '' when absent), the
    request's ``prompt_tokens`` and this choice's share of ``completion_tokens`` (the
    server's ``usage``, split evenly over the choices of one response; None when not
    reported) and ``finish_reason`` (``stop``, ``length``...)."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None


def normalize_endpoint(url: str) -> str:
    """The ``base_url`` for the openai client: ``http://host:port`` (no path) becomes
    ``http://host:port/v1``; a URL with a path is kept (trailing ``/`` removed). Raises
    :class:`EndpointError` for a URL that is not http(s)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise EndpointError(f"endpoint {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
    path = parts.path.rstrip("/")
    if not path:
        path = "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


class ChatClient:
    """Chat completions against ``endpoint`` with ``model``.

    ``api_key``: default the ``OPENAI_API_KEY`` environment variable, else ``"EMPTY"`` (local
    servers need none). ``timeout_s``: time limit of one HTTP request (seconds);
    ``max_retries``: retries of the openai client per request (429/5xx/connection);
    ``probe_timeout_s``: the time limit of :meth:`check`.
    """

    def __init__(self, endpoint: str, model: str, api_key: str | None = None, timeout_s: float = 120.0,
                 max_retries: int = 2, probe_timeout_s: float = 5.0):
        import openai

        self.endpoint = normalize_endpoint(endpoint)
        self.model = model
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.probe_timeout_s = float(probe_timeout_s)
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self._client = openai.OpenAI(base_url=self.endpoint, api_key=key or "EMPTY", timeout=self.timeout_s,
                                     max_retries=self.max_retries)

    def check(self) -> None:
        """Fail fast when the endpoint cannot be used: one ``GET /models`` with the probe
        time limit and no retries. Raises :class:`EndpointError` for a connection error, a
        time-out or 401/403; a server that lacks ``/models`` (404, 405...) is accepted."""
        import openai

        probe = self._client.with_options(timeout=self.probe_timeout_s, max_retries=0)
        try:
            probe.models.list()
        except openai.APITimeoutError:
            raise EndpointError(f"endpoint {self.endpoint} did not answer within {self.probe_timeout_s:g} s") from None
        except openai.APIConnectionError as e:
            raise EndpointError(f"endpoint {self.endpoint} is unreachable: {_cause(e)}") from None
        except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
            raise EndpointError(f"endpoint {self.endpoint} rejected the API key: {e.status_code}") from None
        except openai.APIStatusError:
            return
        except openai.OpenAIError:
            return  # e.g. a /models reply in another format: the chat requests will tell

    def complete(self, messages: list[dict], n: int = 1, temperature: float = 0.0, max_tokens: int | None = None,
                 seed: int | None = None) -> list[Completion]:
        """``n`` sampled answers to ``messages`` (OpenAI chat format). Asks for ``n`` choices in
        one request; when the server returns fewer (many ignore ``n``), asks again for the
        rest, at most ``n`` requests in all. Raises :class:`RequestError` when a request
        fails after the client's retries or the reply has no choices."""
        out: list[Completion] = []
        for _ in range(max(1, n)):
            if len(out) >= n:
                break
            out.extend(self._request(messages, n - len(out), temperature, max_tokens, seed))
        if len(out) < n:
            raise RequestError(f"the server returned {len(out)} of {n} choices")
        return out[:n]

    def _request(self, messages, n, temperature, max_tokens, seed) -> list[Completion]:
        import openai

        kwargs: dict = {"model": self.model, "messages": messages, "temperature": temperature}
        if n != 1:
            kwargs["n"] = n
        if max_tokens is not None:
            kwargs["max_tokens"] = max_tokens
        if seed is not None:
            kwargs["seed"] = seed
        try:
            resp = self._client.chat.completions.create(**kwargs)
        except openai.APITimeoutError:
            raise RequestError(f"no answer within {self.timeout_s:g} s (after {self.max_retries} retries)") from None
        except openai.APIConnectionError as e:
            raise RequestError(f"connection failed: {_cause(e)}") from None
        except openai.APIStatusError as e:
            raise RequestError(f"HTTP {e.status_code}: {_short(str(e.message))}") from None
        except openai.OpenAIError as e:
            raise RequestError(f"{type(e).__name__}: {_short(str(e))}") from None
        except Exception as e:  # noqa: BLE001 - a malformed reply the client could not decode
            raise RequestError(f"malformed reply: {type(e).__name__}: {_short(str(e))}") from None
        choices = list(getattr(resp, "choices", None) or [])
        if not choices:
            raise RequestError("the reply has no choices")
        usage = getattr(resp, "usage", None)
        pt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        ct = getattr(usage, "completion_tokens", None) if usage is not None else None
        share = None if ct is None else int(ct) // len(choices)
        res = []
        for c in choices:
            msg = getattr(c, "message", None)
            text = getattr(msg, "content", None) if msg is not None else None
            res.append(Completion(text if isinstance(text, str) else "", pt, share, getattr(c, "finish_reason", None)))
        return res


def _cause(e: BaseException) -> str:
    c = e.__cause__ or e.__context__
    return _short(f"{type(c).__name__}: {c}" if c is not None else str(e))


def _short(s: str, limit: int = 300) -> str:
    s = " ".join(s.split())
    return s if len(s) <= limit else s[:limit] + "..."


__all__ = ["ChatClient", "Completion", "EndpointError", "RequestError", "normalize_endpoint"]
