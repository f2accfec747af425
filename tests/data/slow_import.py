"""A module that takes a while to import, and records an interruption during its import."""

import os
import time

try:
    time.sleep(0.8)
except BaseException:
    with open(os.environ["SLOW_IMPORT_MARKER"], "a") as f:
        f.write("interrupted during import\n")
    raise

READY = True
