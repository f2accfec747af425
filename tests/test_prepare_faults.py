"""Host preparation is under the dead man's switch: a client interrupted or killed while its
hosts run the bootstrap (here, the image's setup commands) leaves no process on any host."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import interactive_signals
from tests.test_ssh import leftovers, wait_until

CLIENT = """
import json, sys
import skyward as sky
cfg = json.loads(sys.argv[1])
provider = sky.SSH(cfg["hosts"], user=cfg["user"], key=cfg["key"], known_hosts=cfg["known_hosts"],
                   find_links=[cfg["wheelhouse"]], no_index=True)
image = sky.Image(env={"RUN": cfg["tag"]}, setup=[f"touch {cfg['marker']}-$(hostname)", "sleep 4848"])
with sky.ComputePool(provider=provider, nodes=len(cfg["hosts"]), image=image, console=False):
    pass
"""


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_client_stopped_during_setup_leaves_no_process_on_the_hosts(test_hosts, wheelhouse, tmp_path, how):
    hosts = test_hosts[:2]
    tag = uuid.uuid4().hex[:8]
    marker = f"/tmp/skyward-setup-{tag}"
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    cfg = {"hosts": [h.ip for h in hosts], "user": hosts[0].user, "key": hosts[0].key_path,
           "known_hosts": hosts[0].known_hosts_all, "wheelhouse": wheelhouse, "tag": tag, "marker": marker}
    client = subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, preexec_fn=interactive_signals)
    try:
        started = wait_until(lambda: all(Path(f"{marker}-{h.name}").exists() for h in hosts), 120)
        assert started, client.stdout.read() if client.poll() is not None else "setup did not start"
        assert wait_until(lambda: all(h.processes(r"^sleep 4848") for h in hosts), 10)
        client.send_signal(how)
        stopped = time.monotonic()
        client.wait(30)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        for h in hosts:
            Path(f"{marker}-{h.name}").unlink(missing_ok=True)
    assert wait_until(lambda: not leftovers(hosts, r"^sleep 4848|bootstrap/"), 10), leftovers(hosts, r"sleep 4848|bootstrap/")
    print(f"\nhost processes gone {time.monotonic() - stopped:.2f}s after {how.name}")
