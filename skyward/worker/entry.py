"""The worker's entry: what ``python -m skyward.worker`` runs, and a worker forked from the warm
template (:mod:`skyward.worker.template`) runs too, the same way."""

from __future__ import annotations


def run(args: list[str]) -> int:
    """Be the worker (``args``: the command line's, after the module): split off the keepers,
    then run the agent; the worker's exit code."""
    from skyward.worker import keeper
    from skyward.worker.agent import main

    resident = None
    if "--resident" in args:  # a named cluster's worker (skyward.worker.resident)
        from skyward.worker.resident import daemonize, options, stay

        resident = options(args)
        if resident.pop("in_step"):  # a job step: the step must not end before the worker
            stay(resident["path"])
        else:
            daemonize(resident["path"])  # returns in the detached process only
    keeper.split()  # from here on, this is the worker; its keeper waits to clear up after it
    return main(resident)
