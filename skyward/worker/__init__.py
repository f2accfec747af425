"""The worker agent: ``python -m skyward.worker``.

One long-lived process per worker slot of a node. The agent (:mod:`.agent`) speaks the framed
protocol (:mod:`skyward.protocol`) on its stdin/stdout, runs the plugins' ``around_app`` hooks
once, sends heartbeats and exits by itself when the client goes silent; an executor
(:mod:`.executors`: threads or child processes) runs the tasks in ``concurrency`` slots and
streams their output back line by line (:mod:`.output`). It imports nothing heavy: user code
and plugins bring their own imports.
"""
