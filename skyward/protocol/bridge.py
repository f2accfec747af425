"""The bridge between a client and a named cluster's resident worker: the stdlib-only script
a transport starts on the node (``python -I -c BRIDGE SOCKET``), so that the client reaches the
worker's Unix socket through the same byte stream as any worker's stdin/stdout. Shared by the
client (which starts it) and the worker (which knows its exit code); imports nothing.
"""

from __future__ import annotations

__all__ = ["BRIDGE", "NO_WORKER"]

#: What a client's bridge runs (``python -I -c BRIDGE SOCKET``): copy stdin to the socket and
#: the socket to stdout until either ends. The standard library only, so it starts in tens of
#: milliseconds; stdin's end (the client is gone) closes the socket's sending side, which ends
#: the worker's session.
BRIDGE = r"""
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as e:
    sys.stderr.write("skyward: no cluster worker at %s: %s\n" % (sys.argv[1], e.strerror))
    sys.exit(17)
def up():
    try:
        while True:
            b = os.read(0, 1 << 20)
            if not b:
                break
            s.sendall(b)
    except OSError:
        pass
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
try:
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        v = memoryview(b)
        while v:
            v = v[os.write(1, v):]
except OSError:
    pass
os._exit(0)
"""
#: The bridge's exit code when nothing listens on the socket (the cluster's worker is gone).
NO_WORKER = 17
