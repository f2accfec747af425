"""Fixtures for AWS tests: moto's EC2 server on loopback, and a leak check after every test.

``moto_server`` (session) starts ``python -m moto.server`` as a subprocess on a free port
(on every interface, so that the SSH test hosts reach it too; tests use it on loopback). ``aws`` (per test) points boto3 at it the way a user would point it anywhere — the
``AWS_ENDPOINT_URL`` environment variable, fake credentials, a region, and empty config and
credentials files so nothing from this machine's ``~/.aws`` leaks in — and, after the test,
asserts that no skyward-tagged instance (not yet shutting down or terminated), key pair or
security group is left, then resets the server. Skyward's code runs unchanged: no endpoint
or client is injected into it.

Import both into a conftest.py (or a test module)::

    from tests.aws_conftest import aws, moto_server  # noqa: F401
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"
_AMIS: dict[str, str] = {}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """The URL (on loopback) of a moto server (all AWS services) running in a subprocess."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    port = _free_port()
    # (on every interface: a managed jobs' controller placed on an SSH test host calls it from
    # there; its request recorder, off until a test starts it, writes to a file of its own; its
    # request log goes to a file too: a pipe nobody reads fills up and stalls the server)
    recording = Path(tempfile.mkdtemp(prefix="skyward-moto-")) / "recording"
    log = (recording.parent / "server.log").open("w+b")
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port), "-H", "0.0.0.0"],
                            stdout=subprocess.DEVNULL, stderr=log,
                            env={**os.environ, "MOTO_RECORDER_FILEPATH": str(recording)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail("moto server exited: " + log.read().decode(errors="replace")[-2000:])
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("moto server did not answer within 30s")
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(recording.parent, ignore_errors=True)


@dataclass
class AwsTestEnv:
    """What an AWS test gets: the endpoint, the region, clients, and a moto-known AMI."""

    endpoint: str
    region: str

    def client(self, service: str = "ec2", region: str | None = None) -> Any:
        import boto3

        return boto3.client(service, region_name=region or self.region)

    @property
    def ami(self) -> str:
        """An AMI the server knows (moto ships the same set of public images after every reset)."""
        if self.region not in _AMIS:
            images = self.client().describe_images(Owners=["amazon"])["Images"]
            _AMIS[self.region] = sorted(i["ImageId"] for i in images if i.get("RootDeviceName"))[0]
        return _AMIS[self.region]

    def leftovers(self) -> dict[str, list[str]]:
        """Skyward-tagged resources still there: live instances, key pairs, security groups."""
        ec2 = self.client()
        tagged = [{"Name": "tag-key", "Values": ["skyward:pool"]}]
        live = [i["InstanceId"] for r in ec2.describe_instances(Filters=tagged)["Reservations"]
                for i in r["Instances"] if i["State"]["Name"] not in ("shutting-down", "terminated")]
        keys = [k["KeyName"] for k in ec2.describe_key_pairs(Filters=tagged)["KeyPairs"]]
        groups = [g["GroupId"] for g in ec2.describe_security_groups(Filters=tagged)["SecurityGroups"]]
        return {k: v for k, v in {"instances": live, "key_pairs": keys, "security_groups": groups}.items() if v}


@pytest.fixture
def aws(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[AwsTestEnv]:
    """boto3 configured (by environment) for the moto server; zero skyward resources afterwards."""
    config = tmp_path / "aws-config"
    credentials = tmp_path / "aws-credentials"
    config.write_text("")
    credentials.write_text("")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    env = AwsTestEnv(moto_server, REGION)
    try:
        yield env
        left = env.leftovers()
        assert not left, f"skyward-tagged AWS resources left behind: {left}"
    finally:
        request = urllib.request.Request(moto_server + "/moto-api/reset", method="POST")
        urllib.request.urlopen(request, timeout=10).close()
