"""Node-to-node tensor copies: a listener per worker process and its connections to the others.

A copy ``sky:A -> sky:B`` is two operations: ``$send`` in A's stream (A's worker sends the
tensor's bytes straight to B's) and ``$recv`` in B's (B's device thread waits for those bytes
and copies them in). Each runs in its own device's order, so the copy sees every earlier write
to the source and comes before every later operation on the destination, with no round trip to
the client; the client sees no payload bytes.

The listener binds only to the address the pool's other nodes reach this node at, and accepts
only a peer that proves it holds the client's secret (an HMAC of a fresh nonce): there is no
unauthenticated port. A connection is kept for later copies between the same two workers.

Wire format after the handshake: frames of ``!QQ`` (transfer id, byte count) and the bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from typing import Any

import torch

_HEADER = struct.Struct("!QQ")
_NONCE = 32
#: Seconds a ``$recv`` waits for a sender that never connected (one that connected and went
#: away fails the copy at once).
RECV_TIMEOUT = 300.0
CONNECT_TIMEOUT = 10.0
_OK = b"ok"


def _proof(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("the peer closed the connection")
        got += k


class PeerError(Exception):
    """A copy between nodes could not be made (the other worker unreachable or gone)."""


class Exchange:
    """This worker's end of the node-to-node channel: one listener, outgoing connections, and
    the transfers received but not yet taken."""

    def __init__(self, address: str, secret: bytes):
        self.secret = secret
        self.worker = os.urandom(8).hex()  # who this worker is to its peers
        self._server = socket.create_server((address, 0), backlog=16)
        self.address = address
        self.port = self._server.getsockname()[1]
        self._cond = threading.Condition()
        self._arrived: dict[int, torch.Tensor] = {}
        self._gone: set[str] = set()  # peers whose connection closed
        self._connected: set[str] = set()
        self._out: dict[tuple[str, int], socket.socket] = {}
        self._out_lock = threading.Lock()
        self.closed = False
        threading.Thread(target=self._accept, name="skyward-peer-listen", daemon=True).start()

    # -- receiving -------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="skyward-peer-in", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        peer = None
        try:
            conn.settimeout(CONNECT_TIMEOUT)
            nonce = os.urandom(_NONCE)
            conn.sendall(nonce)
            answer = bytearray(32 + 8)
            _recv_exactly(conn, memoryview(answer))
            if not hmac.compare_digest(bytes(answer[:32]), _proof(self.secret, nonce)):
                return  # not one of ours: say nothing, close
            peer = bytes(answer[32:]).hex()
            conn.sendall(_OK)
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._cond:
                self._connected.add(peer)
                self._gone.discard(peer)
            header = bytearray(_HEADER.size)
            while True:
                try:
                    _recv_exactly(conn, memoryview(header))
                except ConnectionError:
                    return
                xid, nbytes = _HEADER.unpack(header)
                data = torch.empty(nbytes, dtype=torch.uint8)
                if nbytes:
                    _recv_exactly(conn, memoryview(data.numpy()))
                with self._cond:
                    self._arrived[xid] = data
                    self._cond.notify_all()
        except (OSError, ConnectionError):
            return
        finally:
            conn.close()
            if peer is not None:
                with self._cond:
                    self._gone.add(peer)
                    self._cond.notify_all()

    def take(self, xid: int, sender: str, timeout: float = RECV_TIMEOUT) -> torch.Tensor:
        """The bytes of transfer ``xid`` from worker ``sender``, waiting for them to arrive."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while xid not in self._arrived:
                if sender in self._gone:
                    raise PeerError(f"the sending worker ({sender}) went away before the copy arrived")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerError(f"the copy from worker {sender} did not arrive within {timeout:g} s")
                self._cond.wait(min(left, 1.0))
            return self._arrived.pop(xid)

    # -- sending -----------------------------------------------------------------------------------
    def connect(self, address: str, port: int) -> socket.socket:
        """A connection to the worker listening at ``address:port``, proven ours (kept)."""
        key = (address, port)
        with self._out_lock:
            sock = self._out.get(key)
            if sock is not None:
                return sock
            try:
                sock = socket.create_connection(key, timeout=CONNECT_TIMEOUT)
                nonce = bytearray(_NONCE)
                _recv_exactly(sock, memoryview(nonce))
                sock.sendall(_proof(self.secret, bytes(nonce)) + bytes.fromhex(self.worker))
                ok = bytearray(len(_OK))
                _recv_exactly(sock, memoryview(ok))
                if bytes(ok) != _OK:
                    raise PeerError("the peer refused this worker")
            except (OSError, ConnectionError) as exc:
                raise PeerError(f"cannot reach the worker at {address}:{port} from here: {exc}") from exc
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._out[key] = sock
            return sock

    def send(self, address: str, port: int, xid: int, tensor: torch.Tensor) -> None:
        """Send ``tensor``'s bytes as transfer ``xid`` to the worker at ``address:port``."""
        data = tensor.detach().contiguous().cpu().reshape(-1)
        raw = data.view(torch.uint8).numpy() if data.numel() else b""
        sock = self.connect(address, port)
        try:
            sock.sendall(_HEADER.pack(xid, len(raw) if isinstance(raw, bytes) else raw.nbytes))
            if len(raw):
                sock.sendall(memoryview(raw))
        except OSError as exc:
            with self._out_lock:
                self._out.pop((address, port), None)
            sock.close()
            raise PeerError(f"the copy to the worker at {address}:{port} broke: {exc}") from exc

    def close(self) -> None:
        self.closed = True
        self._server.close()
        with self._out_lock:
            for sock in self._out.values():
                sock.close()
            self._out.clear()


_exchange: Exchange | None = None
_exchange_lock = threading.Lock()


def exchange(address: str, secret: bytes) -> Exchange:
    """This worker's exchange (made at the first session that asks)."""
    global _exchange
    with _exchange_lock:
        if _exchange is None or _exchange.closed:
            _exchange = Exchange(address, secret)
        return _exchange


def current() -> Exchange:
    if _exchange is None:
        raise PeerError("this worker has no node-to-node channel")
    return _exchange


def peer_info(ex: Exchange) -> dict[str, Any]:
    return {"address": ex.address, "port": ex.port, "worker": ex.worker}
