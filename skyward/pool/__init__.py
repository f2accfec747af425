"""The pool: everything between a user's ``ComputePool`` and the workers.

- :mod:`~skyward.pool.pool`: ``ComputePool``, the user's handle; orders the lifecycle.
- :mod:`~skyward.pool.calls`: what an open pool serves (``submit``, ``run``, ``map``, ``device``...).
- :mod:`~skyward.pool.lifecycle`: the machines and workers (provision, prepare, start, stop).
- :mod:`~skyward.pool.prepare`: host preparation through any transport (bootstrap).
- :mod:`~skyward.pool.dispatch`: which node runs a call; collecting results.
- :mod:`~skyward.pool.connection`: the client's end of one worker (its protocol).
- :mod:`~skyward.pool.turns`: who reads a worker's stream (one reply path for every transport).
"""

from skyward.pool.pool import ComputePool

__all__ = ["ComputePool"]
