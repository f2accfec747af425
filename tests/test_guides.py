"""Every script in guides/ runs, start to end, on the Local provider, as a reader would run it.

Each runs in its own interpreter from the repository root with a time limit; a guide that
fails, hangs, prints a traceback or torch's "Failed to initialize NumPy" warning fails here.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
GUIDES = sorted(p.name for p in (ROOT / "guides").glob("*.py"))
LIMIT = 300  # seconds per guide on a busy 2-core machine; they take 5-60 s alone

# A line each guide prints only when its own check passed.
EXPECT = {
    "data_sharding.py": "same as the fit on all rows: True",
    "ddp_basic.py": "same weights on every rank: True",
    "ddp_distributed.py": "global val accuracy",
    "elastic_map.py": "the retried task returned 49: True",
    "hf_tiny_gpt.py": "loss fell and the ranks agree: True",
    "jax_linear_regression.py": "matches the least-squares fit: True",
    "keras_classifier.py": "the weights score the same here: True",
    "mnist_cnn.py": "test accuracy",
    "remote_cluster.py": "reference equals the trained model: True",
    "remote_mnist.py": "same parameters as the local run: True",
    "runtime_patterns.py": "every value exactly once: True",
    "sklearn_grid_search.py": "held-out accuracy",
}


# What the console says on stderr where a guide's story depends on it.
EXPECT_STDERR = {
    "elastic_map.py": re.compile(r"^skyward: pool \w+ stopped: 25 tasks \(25 done, 0 failed\), 1 retried, ", re.M),
}


def test_every_guide_has_an_expected_line() -> None:
    assert sorted(EXPECT) == GUIDES


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("guide", GUIDES)
def test_guide_runs_on_the_local_provider(guide: str) -> None:
    # PYTHONPATH: the guide (whose own directory starts sys.path) imports this checkout's skyward.
    env = {**os.environ, "SKYWARD_CONSOLE": "plain", "PYTHONWARNINGS": "default", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, f"guides/{guide}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=LIMIT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    assert "Failed to initialize NumPy" not in output
    assert EXPECT[guide] in done.stdout, output[-4000:]
    if guide in EXPECT_STDERR:  # (a retried task that succeeded is done, not failed)
        assert EXPECT_STDERR[guide].search(done.stderr), done.stderr[-4000:]
