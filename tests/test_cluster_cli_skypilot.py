"""SkyPilot's everyday command lines on named clusters, through the real command line (Local
clusters): inline commands instead of a task file, ``launch -c NAME`` with no task at all, and
the flags SkyPilot users type (``--env-file``, ``--workdir``, ``--num-nodes``, ``--git-url``,
``status -r``/``-o json``, ``start -y``, ``down -a``, ``cost-report``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from skyward.clusters import manage
from tests.test_cluster_cli import home, lines, sky, task  # noqa: F401  (home: a fixture)


def status_json(cwd: Path) -> list[dict]:
    shown = sky("status", "-o", "json", cwd=cwd)
    assert shown.returncode == 0, shown.stderr
    return json.loads(shown.stdout)


def test_bare_launch_c_makes_a_cluster_that_runs_nothing_and_exec_runs_inline_commands(
        home: str, tmp_path: Path) -> None:
    made = sky("launch", "-c", "dev", "--num-nodes", "2", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert lines(made.stdout, "") == []  # nothing ran on the nodes
    assert [(s["name"], s["status"], s["nodes"]) for s in status_json(tmp_path)] == [("dev", "UP", 2)]
    workers = manage.ClusterStore().get("dev").workers

    # A command is a task of one node (SkyPilot's num_nodes default): the head runs it, and
    # --num-nodes puts it on the cluster's first N nodes.
    quoted = sky("exec", "dev", "echo hi from $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES", cwd=tmp_path)
    assert quoted.returncode == 0, quoted.stderr
    assert lines(quoted.stdout, "hi from") == ["[node 0] hi from 0 of 1"]
    every = sky("exec", "dev", "--num-nodes", "2", "echo hi from $SKYPILOT_NODE_RANK", cwd=tmp_path)
    assert lines(every.stdout, "hi from") == ["[node 0] hi from 0", "[node 1] hi from 1"]
    words = sky("exec", "dev", "--num-nodes", "2", "echo", "two", "words", cwd=tmp_path)  # joined with spaces
    assert lines(words.stdout, "two words") == ["[node 0] two words", "[node 1] two words"]
    failed = sky("exec", "dev", "--num-nodes", "2", "echo before; exit 3", cwd=tmp_path)
    assert failed.returncode == 100, failed.stderr  # (a failed job: SkyPilot's code)
    assert len(lines(failed.stdout, "before")) == 2
    assert manage.ClusterStore().get("dev").workers == workers  # the same workers all along

    reused = sky("launch", "-c", "dev", "echo again on $SKYPILOT_NUM_NODES", cwd=tmp_path)
    assert reused.returncode == 0, reused.stderr
    assert lines(reused.stdout, "again on") == ["[node 0] again on 1"]
    bare = sky("launch", "-c", "dev", cwd=tmp_path)  # reused as it is, nothing run
    assert bare.returncode == 0, bare.stderr
    assert lines(bare.stdout, "") == []
    assert manage.ClusterStore().get("dev").workers == workers


def test_a_missing_yaml_path_is_an_error_naming_it_and_nothing_is_started(home: str, tmp_path: Path) -> None:
    missing = sky("launch", "-c", "dev", "nothere.yaml", cwd=tmp_path)
    assert missing.returncode == 2
    assert "nothere.yaml" in missing.stderr and "readable task file" in missing.stderr
    assert manage.ClusterStore().get("dev") is None
    nothing = sky("launch", cwd=tmp_path)  # no task and no cluster: there is nothing to do
    assert nothing.returncode == 2
    assert "a task file or a command to run" in nothing.stderr and "-c NAME" in nothing.stderr


def test_launch_c_with_an_inline_command_and_exec_flags(home: str, tmp_path: Path) -> None:
    ran = sky("launch", "-c", "dev", "--num-nodes", "2", "echo launched on $SKYPILOT_NODE_RANK", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert lines(ran.stdout, "launched on") == ["[node 0] launched on 0", "[node 1] launched on 1"]

    envs = tmp_path / "vars.env"
    envs.write_text("# a dotenv file\nFROM_FILE=file-value\nBOTH=from-file\n")
    got = sky("exec", "dev", "--num-nodes", "2", "--env-file", str(envs), "--env", "BOTH=from-flag",
              "echo $FROM_FILE $BOTH", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert lines(got.stdout, "file-value") == ["[node 0] file-value from-flag", "[node 1] file-value from-flag"]

    work = tmp_path / "project"
    work.mkdir()
    (work / "marker.txt").write_text("in the workdir\n")
    seen = sky("exec", "dev", "--num-nodes", "2", "--workdir", str(work), "cat marker.txt", cwd=tmp_path)
    assert seen.returncode == 0, seen.stderr
    assert len(lines(seen.stdout, "in the workdir")) == 2

    one = sky("exec", "dev", "--num-nodes", "1", "echo of $SKYPILOT_NUM_NODES on $SKYPILOT_NODE_RANK", cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert lines(one.stdout, "of ") == ["[node 0] of 1 on 0"]
    many = sky("exec", "dev", "--num-nodes", "3", "true", cwd=tmp_path)
    assert many.returncode == 2
    assert "--num-nodes" in many.stderr and "2" in many.stderr and "3" in many.stderr
    none = sky("exec", "dev", "--num-nodes", "0", "true", cwd=tmp_path)
    assert none.returncode == 2 and "--num-nodes: expected an integer >= 1" in none.stderr


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_launch_git_url_clones_the_workdir_and_a_later_exec_runs_in_it(home: str, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git("init", "-q", "-b", "main", cwd=repo)
    (repo / "version.txt").write_text("one\n")
    git("add", "version.txt", cwd=repo)
    git("commit", "-q", "-m", "one", cwd=repo)
    git("tag", "v1", cwd=repo)
    (repo / "version.txt").write_text("two\n")
    git("commit", "-q", "-am", "two", cwd=repo)

    ran = sky("launch", "-c", "dev", "--git-url", f"file://{repo}", "--git-ref", "v1", "cat version.txt",
              cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert lines(ran.stdout, "one") == ["[node 0] one"]
    again = sky("exec", "dev", "cat version.txt", cwd=tmp_path)  # no workdir of its own: the cluster's
    assert again.returncode == 0, again.stderr
    assert lines(again.stdout, "one") == ["[node 0] one"]
    both = sky("exec", "dev", "--git-url", str(repo), "--workdir", str(tmp_path), "true", cwd=tmp_path)
    assert both.returncode == 2 and "--git-url" in both.stderr and "--workdir" in both.stderr


def test_status_flags_start_y_cost_report_and_down_a(home: str, tmp_path: Path) -> None:
    assert sky("launch", "-c", "one", cwd=tmp_path).returncode == 0
    assert sky("launch", "-c", "two", "--num-nodes", "2", cwd=tmp_path).returncode == 0
    refreshed = sky("status", "-r", cwd=tmp_path)
    assert refreshed.returncode == 0, refreshed.stderr
    assert [row.split()[0] for row in refreshed.stdout.splitlines()[1:]] == ["one", "two"]
    assert sorted(s["name"] for s in status_json(tmp_path)) == ["one", "two"]
    assert json.loads(sky("status", "--json", "one", cwd=tmp_path).stdout)[0]["name"] == "one"

    assert sky("stop", "one", "-y", cwd=tmp_path).returncode == 0
    started = sky("start", "one", "-y", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert [s["status"] for s in status_json(tmp_path) if s["name"] == "one"] == ["UP"]

    report = sky("cost-report", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    header, *rows = report.stdout.splitlines()
    assert header.split()[:2] == ["NAME", "PROVIDER"] and "COST" in header.split()
    assert [r.split()[0] for r in rows if r.split() and r.split()[0] in ("one", "two")] == ["one", "two"]
    assert any(r.startswith("total") for r in rows)

    gone = sky("down", "-a", "-y", cwd=tmp_path)
    assert gone.returncode == 0, gone.stderr
    assert "cluster one ended" in gone.stdout and "cluster two ended" in gone.stdout
    assert manage.ClusterStore().all() == []
    assert sky("status", cwd=tmp_path).stdout == "no clusters\n"
