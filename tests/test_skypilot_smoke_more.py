"""More of SkyPilot's cluster and job smoke tests (tests/smoke_tests/test_basic.py and
test_cluster_job.py in SkyPilot), ported as tests/test_skypilot_smoke.py ports the first ones: one
SkyPilot case's command sequence per test, with ``skyward`` for ``sky`` and SkyPilot's assertions,
on a Local cluster (those taking ``where``: on two SSH test hosts too). Every wait is on a state,
with a bound; docs/cli.md lists every case and what became of it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.test_cluster_cli import home, lines, sky, task  # noqa: F401  (home: a fixture)
from tests.test_skypilot_smoke import MINIMAL, Where, cluster_status, state, where  # noqa: F401  (where: a fixture)


def git(*args: str, cwd: Path) -> str:
    done = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True)
    return done.stdout.strip()


def test_minimal_with_git_workdir(home: str, tmp_path: Path, where: Where) -> None:
    """SkyPilot's test_minimal_with_git_workdir (a repository of the test's own for SkyPilot's on
    GitHub): ``launch --git-url`` clones the workdir, and later ``launch``/``exec`` with
    ``--git-url`` and ``--git-ref`` move the same cluster's clone to a branch, a tag, a commit and
    back to the default branch; ``git status`` in a plain ``exec`` shows where it is."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "master", cwd=repo)
    (repo / "version.txt").write_text("one\n")
    git("add", "version.txt", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    git("tag", "v0.10.0", cwd=repo)
    git("checkout", "-q", "-b", "releases/0.10.0", cwd=repo)
    (repo / "version.txt").write_text("release\n")
    git("commit", "-q", "-am", "release", cwd=repo)
    commit = git("rev-parse", "--short=8", "HEAD", cwd=repo)  # (git status shows it at git's own length)
    shown_as = git("rev-parse", "--short", "HEAD", cwd=repo)
    git("checkout", "-q", "master", cwd=repo)
    (repo / "version.txt").write_text("two\n")
    git("commit", "-q", "-am", "two", cwd=repo)
    url = f"file://{repo}"
    task(tmp_path, MINIMAL, "minimal.yaml")
    where.up("gitwd")

    def at(expected: str) -> None:  # SkyPilot's ``sky exec NAME 'git status | grep X || exit 1'``
        shown = sky("exec", "gitwd", f"git status | grep '{expected}' || exit 1", cwd=tmp_path)
        assert shown.returncode == 0, (expected, shown.stdout, shown.stderr)

    first = sky("launch", "-y", "-c", "gitwd", "--git-url", url, "minimal.yaml", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert state(tmp_path, "gitwd", 1) == (0, "Job 1: SUCCEEDED")
    at("master")
    for command, ref, expected in [("launch", "releases/0.10.0", "releases/0.10.0"), ("launch", None, "master"),
                                   ("exec", "releases/0.10.0", "releases/0.10.0"), ("exec", "v0.10.0", "v0.10.0"),
                                   ("exec", commit, shown_as), ("exec", None, "master")]:
        moved = sky(command, *(["-y", "-c"] if command == "launch" else []), "gitwd", "--git-url", url,
                    *(["--git-ref", ref] if ref else []), "minimal.yaml", cwd=tmp_path)
        assert moved.returncode == 0, (command, ref, moved.stderr)
        at(expected)
