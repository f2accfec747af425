import sys

from skyward.worker import entry

if __name__ == "__main__":  # (not in a process executor's child, which imports this as __mp_main__)
    raise SystemExit(entry.run(sys.argv[1:]))
