"""The terminal console: what the user sees while a pool runs, built from the pool's typed
events alone (:mod:`skyward.events`), never from its internals.

- :mod:`~skyward.console.view`: :class:`Console`, the event subscriber, and its modes;
- :mod:`~skyward.console.state`: what the console knows (nodes, tasks, messages), from events;
- :mod:`~skyward.console.live`: drawing that state with rich.
- :mod:`~skyward.console.snapshot`: the same counts, written for ``skyward dashboard`` by a pool
  that opts in (``dashboard=True``), and read back there.

It imports only :mod:`skyward.events`, :mod:`skyward.errors` (and, for the snapshot, the
home folder); the pool imports it.
"""

from __future__ import annotations

from skyward.console.view import ENV_MODE, ENV_VERBOSE, Console, Mode

__all__ = ["ENV_MODE", "ENV_VERBOSE", "Console", "Mode"]
