"""Who may use the dashboard: the browser of the user who started it, on this machine.

The server listens on 127.0.0.1 only, and every request passes :class:`TokenGuard` first:

1. Its Host must be ``127.0.0.1:PORT`` or ``localhost:PORT``: a page of another site that
   points a name of its own at 127.0.0.1 (DNS rebinding) sends its own name, and is refused.
2. It must carry the token of this start (a new random one each time ``skyward dashboard``
   starts), in the URL (``?token=``, what the printed link holds) or in the cookie that URL
   sets (HttpOnly, SameSite=Strict: no script reads it, no other site's request carries it).
   A request with the token in its URL is sent back to the same path without it, cookie set.
3. A POST (every action is one) must also carry the token in the ``X-Skyward-Token`` header
   (the page has it; a form of another site cannot set a header) and, when the browser sends an
   Origin, that Origin must be this server's.

Anything else is answered 403 before any page or action runs. The comparisons are constant-time.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

__all__ = ["TOKEN_HEADER", "TokenGuard", "cookie_name", "refusal"]

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]
TOKEN_HEADER = "x-skyward-token"


def cookie_name(port: int) -> str:
    """The cookie of the dashboard on ``port`` (cookies are shared by every port of a host)."""
    return f"skyward_dashboard_{port}"


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def refusal(method: str, headers: dict[str, str], query: dict[str, str], cookies: dict[str, str],
            token: str, port: int) -> str | None:
    """Why a request is refused (None: it may go on). ``headers``' names are lower case."""
    hosts = (f"127.0.0.1:{port}", f"localhost:{port}")
    if headers.get("host") not in hosts:
        return "this dashboard answers only to " + " or ".join(hosts)
    if not (_same(query.get("token"), token) or _same(cookies.get(cookie_name(port)), token)):
        return "no valid token: open the URL `skyward dashboard` printed"
    if method != "GET" and method != "HEAD":
        if not _same(headers.get(TOKEN_HEADER), token):
            return f"an action needs the token in its {TOKEN_HEADER} header"
        origin = headers.get("origin")
        if origin is not None and origin not in {f"http://{h}" for h in hosts}:
            return f"an action from origin {origin} (not this dashboard's)"
    return None


class TokenGuard:
    """ASGI middleware: :func:`refusal` for every HTTP request (see the module doc)."""

    def __init__(self, app: ASGIApp, token: str, port: int) -> None:
        self.app, self.token, self.port = app, token, port

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                      send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        jar: SimpleCookie = SimpleCookie()
        try:
            jar.load(headers.get("cookie", ""))
        except Exception:  # (a malformed cookie header: as if none came)
            jar = SimpleCookie()
        cookies = {k: m.value for k, m in jar.items()}
        why = refusal(scope["method"], headers, query, cookies, self.token, self.port)
        if why is not None:
            await _answer(send, 403, [(b"content-type", b"text/plain; charset=utf-8")], f"forbidden: {why}\n")
            return
        if scope["method"] == "GET" and "token" in query:
            rest = urlencode([(k, v) for k, v in query.items() if k != "token"])
            cookie = f"{cookie_name(self.port)}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            await _answer(send, 303, [(b"location", (quote(scope["path"]) + (f"?{rest}" if rest else "")).encode()),
                                      (b"set-cookie", cookie.encode()), (b"cache-control", b"no-store")], "")
            return
        await self.app(scope, receive, send)


async def _answer(send: Callable[[Any], Awaitable[None]], status: int, headers: list[tuple[bytes, bytes]],
                  body: str) -> None:
    data = body.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
