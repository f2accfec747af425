"""The ``skyward`` command against moto's EC2 server, with resources left behind on purpose."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from skyward import cli
from skyward.providers.aws.provider import AWS
from skyward.providers.base import PoolSpec
from skyward.testing import aws_bookkeeping
from tests.aws_conftest import aws, moto_server  # noqa: F401  (fixtures)


def skyward(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """Run the command as a user would: a separate process, real exit status."""
    return subprocess.run([sys.executable, "-m", "skyward.cli", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def abandoned_pool(env, nodes: int, accelerator=None) -> str:
    """Launch a pool and walk away, as a client killed mid-run would: its resources stay."""
    from skyward.accelerators import parse_accelerator

    pool_id = uuid.uuid4().hex[:8]
    provider = AWS(ami=env.ami, ssh_cidr="198.51.100.7/32", allocation="on-demand")
    provider.provision(PoolSpec(pool_id, nodes, parse_accelerator(accelerator)))
    shutil.rmtree(aws_bookkeeping(provider).pools[pool_id].directory)  # the client's private files: not under test here
    return pool_id


def test_help_and_usage_errors_have_the_usual_exit_codes():
    done = skyward("--help")
    assert done.returncode == 0 and "ls" in done.stdout and "down" in done.stdout
    assert skyward("down", "--help").returncode == 0
    missing = skyward()
    assert missing.returncode == 2 and "usage:" in missing.stderr
    assert skyward("ls", "--bogus").returncode == 2
    neither = skyward("down")
    assert neither.returncode == 2 and "give cluster names or pool ids, or --all" in neither.stderr
    assert cli.main(["down", "abc", "--all"]) == 2


def test_ls_with_nothing_left_says_so(aws, capsys):
    assert cli.main(["ls"]) == 0
    assert "no skyward resources in us-east-1" in capsys.readouterr().out


def test_ls_lists_every_resource_of_abandoned_pools_with_type_state_age_and_price(aws, capsys):
    gpu = abandoned_pool(aws, 2, "T4")
    cpu = abandoned_pool(aws, 1)
    try:
        assert cli.main(["ls", "--region", "us-east-1"]) == 0
        out = capsys.readouterr().out
        lines = [line.split() for line in out.splitlines()]
        instances = [line for line in lines if len(line) > 2 and line[1] == "instance"]
        assert sorted(line[0] for line in instances) == sorted([gpu, gpu, cpu])
        t4 = next(line for line in instances if line[0] == gpu)
        assert t4[3] == "g4dn.xlarge" and t4[4] == "on-demand" and t4[5] == "running"
        assert t4[6].endswith("m") and t4[7] == "~$0.53"
        for pool in (gpu, cpu):
            assert [pool, "key-pair", f"skyward-{pool}"] in [line[:3] for line in lines]
            assert any(line[:2] == [pool, "security-group"] for line in lines)
        assert "2 pool(s), 3 instance(s) in us-east-1" in out

        assert cli.main(["ls", "--json"]) == 0
        rows = json.loads(capsys.readouterr().out)
        assert {r["resource"] for r in rows} == {"instance", "key-pair", "security-group"}
        assert {r["price_per_hour"] for r in rows if r["pool"] == gpu and r["resource"] == "instance"} == {0.526}
    finally:
        assert cli.main(["down", "--all"]) == 0


def test_down_removes_one_pool_and_confirms_leaving_the_others(aws, capsys):
    gone = abandoned_pool(aws, 2)
    kept = abandoned_pool(aws, 1)
    try:
        assert cli.main(["down", gone]) == 0
        out = capsys.readouterr().out
        assert f"removed and confirmed: pool {gone} (2 instance(s), 1 key pair(s), 1 security group(s))" in out
        assert cli.main(["ls", "--json"]) == 0
        left = {r["pool"] for r in json.loads(capsys.readouterr().out)}
        assert left == {kept}
        assert cli.main(["down", gone]) == 0  # again: nothing to do is not an error
        assert "nothing to remove" in capsys.readouterr().out
    finally:
        assert cli.main(["down", kept]) == 0


def test_down_all_in_a_separate_process_removes_everything(aws):
    pools = [abandoned_pool(aws, 1), abandoned_pool(aws, 2)]
    done = skyward("down", "--all", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "removed and confirmed: every skyward pool (3 instance(s), 2 key pair(s)" in done.stdout
    listed = skyward("ls", env=dict(os.environ))
    assert listed.returncode == 0 and "no skyward resources" in listed.stdout
    assert all(p not in listed.stdout for p in pools)


def test_errors_exit_1_with_a_message_and_no_traceback(aws, monkeypatch):
    env = dict(os.environ)
    env.pop("AWS_ACCESS_KEY_ID")
    env.pop("AWS_SECRET_ACCESS_KEY")
    done = skyward("ls", env=env)
    assert done.returncode == 1
    assert done.stderr.startswith("skyward: error: invalid credentials") and "Traceback" not in done.stderr
    env = dict(os.environ)
    env.pop("AWS_DEFAULT_REGION")
    done = skyward("ls", env=env)
    assert done.returncode == 1 and "region" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("argv", [["ls", "--help"], ["--version"]])
def test_help_and_version_exit_0(argv, capsys):
    assert cli.main(argv) == 0
    assert capsys.readouterr().out
