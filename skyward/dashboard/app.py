"""The dashboard's web application (Starlette) and its server (uvicorn), on 127.0.0.1 only.

Routes: the pages ``/``, ``/clusters/NAME``, ``/jobs``, ``/clusters/NAME/jobs/ID``,
``/managed/ID`` (a managed job); the JSON they poll under ``/api/`` (``/api/pools``: the pools of
running scripts that opted in; ``/api/costs``: this month's total; ``/api/managed``: the managed
jobs); the actions, each a POST: ``/api/clusters/NAME/{stop,start,down}``,
``/api/clusters/NAME/jobs/ID/cancel`` and ``/api/managed/ID/cancel``. Every request passes :class:`~.guard.TokenGuard` first.
The handlers are plain functions (Starlette runs them in its thread pool): a slow node holds
one request, never the server. A state that cannot be read is a JSON ``error`` (503 for a read,
409 for an action refused), never a 500.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path
from typing import IO, Any

from skyward._optional import require
from skyward.dashboard import costs, managed, pages, views
from skyward.dashboard.guard import TokenGuard
from skyward.errors import ConfigError

__all__ = ["DEFAULT_PORT", "build", "listen", "serve"]

#: ``skyward dashboard``'s port when none is given (another free one when it is taken).
DEFAULT_PORT = 8790
STATIC = Path(__file__).resolve().parent / "static"


def build(token: str, port: int) -> Any:
    """The application for the server on ``port`` that admits ``token``."""
    require("starlette", "skyward dashboard")
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    def answer(found: Any, failed: int = 503) -> Response:
        code = failed if isinstance(found, dict) and "error" in found else 200
        return JSONResponse(found, status_code=code, headers={"cache-control": "no-store"})

    def html(text: str) -> Response:
        return HTMLResponse(text, headers={"cache-control": "no-store", "x-frame-options": "DENY",
                                           "content-security-policy": "default-src 'self'; frame-ancestors 'none'"})

    def job_id(request: Request) -> int:
        return int(request.path_params["job"])

    def carried(request: Request) -> dict[str, int]:
        text = request.query_params.get("seen", "")
        try:
            return {n: int(c) for n, c in (p.split(":") for p in text.split(",") if p)}
        except ValueError:
            return {}

    def seen(request: Request) -> dict[int, int]:
        try:
            return {int(n): c for n, c in carried(request).items()}
        except ValueError:
            return {}

    def action(request: Request) -> Response:
        what = request.path_params["action"]
        if what not in ("stop", "start", "down"):
            return JSONResponse({"error": f"no action {what} (stop, start or down)"}, status_code=404)
        return answer(views.act(what, request.path_params["name"]), 409)

    routes = [
        Route("/", lambda r: html(pages.clusters_page(token))),
        Route("/jobs", lambda r: html(pages.jobs_page(token))),
        Route("/clusters/{name}", lambda r: html(pages.cluster_page(token, r.path_params["name"]))),
        Route("/clusters/{name}/jobs/{job:int}",
              lambda r: html(pages.job_page(token, r.path_params["name"], job_id(r)))),
        Route("/api/clusters", lambda r: answer(views.safely(views.clusters))),
        Route("/api/clusters/{name}", lambda r: answer(views.safely(lambda: views.cluster(r.path_params["name"])))),
        Route("/api/jobs", lambda r: answer(views.safely(views.queues))),
        Route("/api/pools", lambda r: answer(views.safely(views.pools))),
        Route("/api/costs", lambda r: answer(views.safely(costs.month))),
        Route("/api/managed", lambda r: answer(views.safely(managed.queue))),
        Route("/managed/{job:int}", lambda r: html(pages.managed_page(token, job_id(r)))),
        Route("/api/managed/{job:int}/log", lambda r: answer(views.safely(lambda: managed.log(job_id(r), carried(r))))),
        Route("/api/managed/{job:int}/cancel",
              lambda r: answer(views.done("cancel managed job", views.safely(lambda: managed.cancel(job_id(r)))), 409),
              methods=["POST"]),
        Route("/api/clusters/{name}/jobs/{job:int}/log",
              lambda r: answer(views.safely(lambda: views.job_log(r.path_params["name"], job_id(r), seen(r))))),
        Route("/api/clusters/{name}/{action}", action, methods=["POST"]),
        Route("/api/clusters/{name}/jobs/{job:int}/cancel",
              lambda r: answer(views.act("cancel", r.path_params["name"], job_id(r)), 409), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC)),
    ]
    return TokenGuard(Starlette(routes=routes), token, port)


def listen(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` (0: any free port)."""
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError("--port", "a TCP port, 0 to 65535 (0: any free one)", port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        sock.close()
        raise ConfigError("--port", "a port free on 127.0.0.1", port, detail=str(exc)) from exc
    sock.listen(128)
    return sock


def serve(port: int | None, *, browser: bool, out: IO[str]) -> int:
    """Serve the dashboard until interrupted; print its URL (and open it in a browser)."""
    uvicorn = require("uvicorn", "skyward dashboard")
    require("starlette", "skyward dashboard")
    try:
        sock = listen(DEFAULT_PORT if port is None else port)
    except ConfigError:
        if port is not None:
            raise
        sock = listen(0)  # (the default port is taken: another dashboard, another program)
    bound = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    url = f"http://127.0.0.1:{bound}/?token={token}"
    out.write(f"skyward dashboard: {url}\n(from another machine: ssh -L {bound}:127.0.0.1:{bound} THIS_HOST, "
              "then open the same URL there; Ctrl-C stops it)\n")
    out.flush()
    if browser:
        import webbrowser

        webbrowser.open(url)
    server = uvicorn.Server(uvicorn.Config(build(token, bound), log_level="warning", access_log=False,
                                           lifespan="off"))
    server.run(sockets=[sock])
    return 0
