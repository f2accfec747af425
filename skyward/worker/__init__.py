"""The worker agent: ``python -m skyward.worker``.

One long-lived process per node. It speaks the framed protocol (:mod:`skyward.protocol`) on
its stdin/stdout, runs the plugins' ``around_app`` hooks once, runs tasks in ``concurrency``
slots, streams their output back line by line, sends heartbeats, and exits by itself when the
client goes silent. It imports nothing heavy: user code and plugins bring their own imports.
"""
