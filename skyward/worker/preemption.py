"""Watching EC2's instance metadata for spot preemption notices, on a spot node's worker.

The pool asks for it in the SETUP (``Setup.watch_preemption``) for the instances its provider
rents as spot; the worker then runs :func:`watch` on a thread of its own. Every
:data:`POLL_INTERVAL` seconds it reads two items of the instance metadata service (IMDS):

* ``spot/instance-action``: 404 until EC2 schedules the interruption, then
  ``{"action": "terminate" | "stop" | "hibernate", "time": "...Z"}``, about two minutes ahead;
* ``events/recommendations/rebalance``: 404 until EC2 recommends a rebalance (the machine is
  at elevated risk), then ``{"noticeTime": "...Z"}``.

Each kind is reported once, as a :class:`~skyward.runtime.preemption.Preemption`. IMDSv2 is used (a
session token from ``PUT /latest/api/token``, asked again before it expires or when refused),
with the IMDSv1 fallback (plain GETs) when the token request is answered with an HTTP error.
``AWS_EC2_METADATA_SERVICE_ENDPOINT`` moves the endpoint, as it does for AWS's own SDKs. When
nothing answers (not on EC2), the watcher stays quiet and keeps trying at the same pace.

Why http.client and not urllib.request: urllib follows ``http_proxy`` from the environment,
and a proxy must never see (or refuse) link-local metadata requests; http.client connects
where it is told, and it is lighter to import on a worker. Nothing here is imported unless
the worker watches.
"""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from skyward.runtime.preemption import Preemption

__all__ = ["ENDPOINT_VAR", "POLL_INTERVAL", "MetadataClient", "PreemptionWatcher", "watch"]

#: Where IMDS answers on every EC2 instance.
DEFAULT_ENDPOINT = "http://169.254.169.254"
#: The variable AWS's SDKs read to move the endpoint (a stand-in, an IPv6 address).
ENDPOINT_VAR = "AWS_EC2_METADATA_SERVICE_ENDPOINT"
TOKEN_PATH = "/latest/api/token"
INTERRUPTION_PATH = "/latest/meta-data/spot/instance-action"
REBALANCE_PATH = "/latest/meta-data/events/recommendations/rebalance"
#: Seconds between two looks. AWS suggests every 5 s; 2 s leaves more of the two minutes to
#: the task, at two small local requests a look.
POLL_INTERVAL = 2.0
#: The token's lifetime we ask for (IMDS grants at most 6 hours); it is renewed a minute early.
TOKEN_TTL = 21600
REQUEST_TIMEOUT = 1.0
#: When an interruption notice's time cannot be read: the notice's usual lead.
NOTICE_LEAD = timedelta(minutes=2)


class MetadataClient:
    """GETs of instance metadata paths, through an IMDSv2 session token when IMDS gives one."""

    def __init__(self, endpoint: str | None = None, timeout: float = REQUEST_TIMEOUT):
        url = urllib.parse.urlsplit(endpoint or os.environ.get(ENDPOINT_VAR) or DEFAULT_ENDPOINT)
        self.host = url.hostname or "169.254.169.254"
        self.port = url.port or 80
        self.timeout = timeout
        self._token: str | None = None
        self._token_until = 0.0  # monotonic time after which the token is renewed
        self._v1 = False  # the token request was refused: plain GETs (IMDSv1)

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(64 * 1024)
        finally:
            conn.close()

    def _renew_token(self) -> None:
        status, body = self._request("PUT", TOKEN_PATH, {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
        if status == 200 and body:
            self._token, self._v1 = body.decode("ascii", "replace").strip(), False
            self._token_until = time.monotonic() + TOKEN_TTL - 60
        else:  # IMDSv1 only (or tokens refused): GETs go without one; ask again later
            self._token, self._v1 = None, True
            self._token_until = time.monotonic() + 300

    def get(self, path: str) -> tuple[int, bytes]:
        """``(status, body)`` of a GET of ``path``. Raises OSError when IMDS cannot be reached."""
        if time.monotonic() >= self._token_until:
            self._renew_token()
        for attempt in (1, 2):
            headers = {"X-aws-ec2-metadata-token": self._token} if self._token else {}
            status, body = self._request("GET", path, headers)
            if status != 401 or attempt == 2:
                return status, body
            self._renew_token()  # the token expired or IMDS restarted: once more with a new one
        raise AssertionError("unreachable")


def _utc(text: object) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def parse_interruption(body: bytes) -> Preemption:
    """The interruption notice in an ``instance-action`` answer (what cannot be read is
    filled in: action None, the time two minutes from now)."""
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    action = data.get("action")
    now = datetime.now(timezone.utc)
    return Preemption("interruption", str(action) if action else None, _utc(data.get("time")) or now + NOTICE_LEAD,
                      heard=now)


def parse_rebalance(body: bytes) -> Preemption:
    """The rebalance recommendation in a ``recommendations/rebalance`` answer."""
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    now = datetime.now(timezone.utc)
    return Preemption("rebalance", None, _utc(data.get("noticeTime")) or now, heard=now)


class PreemptionWatcher:
    """Looks for both notices; hands each new one to ``on_notice`` (once per kind)."""

    def __init__(self, on_notice: Callable[[Preemption], None], client: MetadataClient | None = None):
        self.on_notice = on_notice
        self.client = client or MetadataClient()
        self.seen: set[str] = set()

    def poll(self) -> None:
        """One look at both items (quietly nothing when IMDS does not answer)."""
        for kind, path, parse in (("rebalance", REBALANCE_PATH, parse_rebalance),
                                  ("interruption", INTERRUPTION_PATH, parse_interruption)):
            if kind in self.seen:
                continue
            try:
                status, body = self.client.get(path)
            except (OSError, http.client.HTTPException):
                return  # not on EC2, or IMDS busy: the next look tries again
            if status == 200:
                self.seen.add(kind)
                self.on_notice(parse(body))

    def run(self, stop: threading.Event, interval: float = POLL_INTERVAL) -> None:
        """Poll until ``stop`` is set or both notices have been seen."""
        while not stop.is_set() and len(self.seen) < 2:
            self.poll()
            stop.wait(interval)


def watch(on_notice: Callable[[Preemption], None], stop: threading.Event,
          interval: float = POLL_INTERVAL) -> threading.Thread:
    """Start watching on a daemon thread (it ends with ``stop``); returns the thread."""
    watcher = PreemptionWatcher(on_notice)
    thread = threading.Thread(target=watcher.run, args=(stop, interval), name="skyward-preemption", daemon=True)
    thread.start()
    return thread
