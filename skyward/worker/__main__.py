from skyward.worker.agent import main

if __name__ == "__main__":  # (not in a process executor's child, which imports this as __mp_main__)
    from skyward.worker import keeper

    keeper.split()  # from here on, this is the worker; its keeper waits to clear up after it
    raise SystemExit(main())
