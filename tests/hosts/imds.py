#!/usr/bin/env python3
"""A stand-in for EC2's instance metadata service (IMDS), for preemption tests.

It answers what a spot instance's IMDS answers about preemption, and nothing else:

* ``PUT /latest/api/token`` (with ``X-aws-ec2-metadata-token-ttl-seconds``): a session token
  (IMDSv2); refused with 403 when started with ``--v1-only`` (an IMDSv1-only service);
* ``GET /latest/meta-data/spot/instance-action`` and
  ``GET /latest/meta-data/events/recommendations/rebalance``: 404 until the test publishes the
  notice, then its JSON. With tokens in use, a GET without a valid token gets 401.

Run as a script, it is driven through its stdin, one JSON command a line (``publish``,
``expire_tokens``, ``mark``), and reports on its stdout: first ``{"ready": port}``, then one
line per request served (and each mark asked for). The end of its stdin ends it, so it never outlives the test that started it.

:class:`StandIn` starts and drives one; :func:`on_loopback` runs it on this machine, and
:func:`in_host` inside an SSH test host's network namespace at IMDS's real address
(169.254.169.254:80, on the namespace's loopback interface), so the code under test uses its
default endpoint unchanged. Both undo everything on exit. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import queue
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

IMDS_ADDRESS = "169.254.169.254"
TOKEN_PATH = "/latest/api/token"
INTERRUPTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"


# -- the server (script mode) ------------------------------------------------------------------


class _State:
    def __init__(self, v1_only: bool):
        self.v1_only = v1_only
        self.lock = threading.Lock()
        self.tokens: set[str] = set()
        self.published: dict[str, tuple[float, str]] = {}  # path -> (monotonic time it appears, body)
        self.out = threading.Lock()

    def report(self, record: dict[str, Any]) -> None:
        with self.out:
            sys.stdout.write(json.dumps(record) + "\n")
            sys.stdout.flush()


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *args: Any) -> None:  # (requests are reported on stdout instead)
            pass

        def _answer(self, status: int, body: str = "") -> None:
            # Reported before it is answered: once the client has its answer, a mark asked
            # for afterwards (StandIn.served) comes after this line.
            token = self.headers.get("X-aws-ec2-metadata-token")
            state.report({"method": self.command, "path": self.path, "status": status, "token": bool(token)})
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_PUT(self) -> None:
            if self.path != TOKEN_PATH:
                return self._answer(404)
            if state.v1_only or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return self._answer(403 if state.v1_only else 400)
            token = secrets.token_urlsafe(24)
            with state.lock:
                state.tokens.add(token)
            self._answer(200, token)

        def do_GET(self) -> None:
            if not state.v1_only:
                with state.lock:
                    valid = self.headers.get("X-aws-ec2-metadata-token") in state.tokens
                if not valid:
                    return self._answer(401)
            with state.lock:
                found = state.published.get(self.path)
            if found is None or time.monotonic() < found[0]:
                return self._answer(404)
            self._answer(200, found[1])

    return Handler


def serve(host: str, port: int, v1_only: bool) -> None:
    """Serve until stdin ends, taking commands from it."""
    state = _State(v1_only)
    server = ThreadingHTTPServer((host, port), _handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.report({"ready": server.server_address[1]})
    for line in sys.stdin:
        command = json.loads(line)
        with state.lock:
            if command["op"] == "publish":
                state.published[command["path"]] = (time.monotonic() + command.get("after", 0.0), command["body"])
            elif command["op"] == "expire_tokens":
                state.tokens.clear()
            elif command["op"] == "mark":
                state.report({"mark": command["mark"]})
    server.shutdown()


# -- the test's side ------------------------------------------------------------------------------


def _utc(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class StandIn:
    """A running stand-in IMDS: publish notices, expire tokens, see the requests it served."""

    def __init__(self, argv: list[str], endpoint_host: str):
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._requests: list[dict[str, Any]] = []
        self._marks = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            first = self._lines.get(timeout=20)
        except queue.Empty:
            first = None
        if not first or "ready" not in first:
            self.close()
            raise RuntimeError(f"the stand-in IMDS did not start: {argv}")
        self.endpoint = f"http://{endpoint_host}:{first['ready']}"

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            record = json.loads(line)
            if "method" in record:
                self._requests.append(record)
            else:
                self._lines.put(record)
        self._lines.put(None)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request answered so far (method, path, status, whether it had a token)."""
        if self._proc.stdin is None or self._proc.stdin.closed:  # stopped: all of them are in
            return list(self._requests)
        self._caught_up()
        return list(self._requests)

    def _caught_up(self, timeout: float = 60.0) -> None:
        """Wait until the server has taken every command sent so far (and reported every
        request it answered before): it takes them in order, so its answer to a new mark
        says so. The bound is generous: a loaded machine is slow, not wrong."""
        self._marks += 1
        self._send(op="mark", mark=self._marks)
        deadline = time.monotonic() + timeout
        while True:
            try:
                record = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"the stand-in IMDS took no command for {timeout:.0f} s") from None
            if record is None or record.get("mark") == self._marks:
                return

    def _send(self, **command: Any) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()

    def _command(self, **command: Any) -> None:
        """Send a command and return once the server has taken it: a request made afterwards
        sees its effect (a notice published, tokens expired), however slow the machine."""
        self._send(**command)
        self._caught_up()

    def interrupt(self, action: str = "terminate", *, in_seconds: float = 120.0, after: float = 0.0) -> datetime:
        """Schedule the spot interruption notice: it appears ``after`` seconds from now and
        says the machine will ``action`` ``in_seconds`` after that. Returns that time (whole
        seconds, UTC, as IMDS gives it)."""
        at = (datetime.now(timezone.utc) + timedelta(seconds=after + in_seconds)).replace(microsecond=0)
        self._command(op="publish", path=INTERRUPTION_PATH, after=after,
                      body=json.dumps({"action": action, "time": _utc(at)}))
        return at

    def rebalance(self, *, after: float = 0.0) -> datetime:
        """Schedule a rebalance recommendation ``after`` seconds from now; returns its time."""
        at = (datetime.now(timezone.utc) + timedelta(seconds=after)).replace(microsecond=0)
        self._command(op="publish", path=REBALANCE_PATH, after=after, body=json.dumps({"noticeTime": _utc(at)}))
        return at

    def expire_tokens(self) -> None:
        """Forget every session token handed out (as after their TTL)."""
        self._command(op="expire_tokens")

    def close(self) -> None:
        """Stop the server (the end of its stdin ends it; killed if it does not) and wait."""
        with contextlib.suppress(OSError, ValueError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(5)


@contextlib.contextmanager
def on_loopback(*, v1_only: bool = False) -> Iterator[StandIn]:
    """A stand-in IMDS on 127.0.0.1 at a free port (its URL is ``.endpoint``)."""
    argv = [sys.executable, __file__, "127.0.0.1", "0", *(["--v1-only"] if v1_only else [])]
    server = StandIn(argv, "127.0.0.1")
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def in_host(host: Any, *, v1_only: bool = False) -> Iterator[StandIn]:
    """A stand-in IMDS inside test host ``host``'s network namespace, at IMDS's real address:
    169.254.169.254 is added to the namespace's loopback interface for the block, and removed
    (with the server stopped) afterwards."""
    subprocess.run(["ip", "-n", host.netns, "addr", "add", f"{IMDS_ADDRESS}/32", "dev", "lo"],
                   check=True, capture_output=True)
    try:
        argv = ["ip", "netns", "exec", host.netns, sys.executable, __file__, IMDS_ADDRESS, "80",
                *(["--v1-only"] if v1_only else [])]
        server = StandIn(argv, IMDS_ADDRESS)
        try:
            yield server
        finally:
            server.close()
    finally:
        subprocess.run(["ip", "-n", host.netns, "addr", "del", f"{IMDS_ADDRESS}/32", "dev", "lo"],
                       check=False, capture_output=True)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), "--v1-only" in sys.argv[3:])
