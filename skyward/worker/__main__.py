import sys

from skyward.worker.agent import main

if __name__ == "__main__":  # (not in a process executor's child, which imports this as __mp_main__)
    from skyward.worker import keeper

    resident = None
    if "--resident" in sys.argv:  # a named cluster's worker (skyward.worker.resident)
        from skyward.worker.resident import daemonize, options, stay

        resident = options(sys.argv[1:])
        if resident.pop("in_step"):  # a job step: the step must not end before the worker
            stay(resident["path"])
        else:
            daemonize(resident["path"])  # returns in the detached process only
    keeper.split()  # from here on, this is the worker; its keeper waits to clear up after it
    raise SystemExit(main(resident))
