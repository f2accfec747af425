"""A user's program, as the fault matrix runs it: ``python client.py CONFIG`` (JSON).

It opens a 2-node pool on the provider given and goes to the phase given, where it stays (a
plugin hook or a task holds) until the test applies the exit path from outside (a signal to
this program, a worker killed or stopped, a host cut off), or applies it itself (``return``,
``exception``). A running task is a broadcast (``@``), or with a path ending ``-gather`` or
``-run``, a ``gather`` of one task per node or a ``>>`` on node 1. The processes a task starts carry ``SKYWARD_FAULT_TAG=<tag>`` in their
environment (on Local, the workers too: they inherit this program's), so the test can find
whatever is left; on the SSH hosts it also looks for any skyward process. Reaching a phase, a node
writes ``<marker>-<phase>-<node>`` holding its worker's pid (/tmp is shared with the hosts).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import skyward as sky

#: A daemon the classic way (fork, new session, fork): it must end with its worker too.
DAEMON = "import os, time\nif os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\ntime.sleep(3600)\n"


def reached(marker: str, phase: str) -> None:
    node = sky.instance_info().node
    with open(f"{marker}-{phase}-{node}.part", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"{marker}-{phase}-{node}.part", f"{marker}-{phase}-{node}")


def hold_plugin(tag: str, marker: str, phase: str, path: str) -> sky.Plugin:
    @contextlib.contextmanager
    def around_app(info):
        os.environ["SKYWARD_FAULT_TAG"] = tag  # for every process a task starts
        if phase == "scaling" and info.node == 1:  # the node a scale-up adds: its start holds
            reached(marker, "scaling")
            time.sleep(3600)
        if phase == "starting":
            reached(marker, "starting")
            if path == "exception" and info.node == 1:
                raise RuntimeError("node 1 cannot start")
            time.sleep(3600)
        yield
        if phase == "teardown":
            reached(marker, "teardown")
            time.sleep(3600)

    return sky.Plugin("hold", around_app=around_app)


@sky.compute
def run_then_hold(marker: str, phase: str, path: str) -> int:
    subprocess.Popen([sys.executable, "-c", DAEMON], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL).wait()
    subprocess.Popen(["sleep", "3600"], start_new_session=True, stdin=subprocess.DEVNULL)
    reached(marker, "running")
    node = sky.instance_info().node
    if path == "exception" and node == 1:
        raise ValueError("node 1 fails")
    if phase == "running" and path != "return":
        time.sleep(3600)
    return node


@sky.compute
def hold_on_node_0(marker: str) -> int:
    """An elastic pool's queued work: on node 0 (the only one) it starts a daemon and a
    process in a session of its own, says so and holds."""
    subprocess.Popen([sys.executable, "-c", DAEMON], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL).wait()
    subprocess.Popen(["sleep", "3600"], start_new_session=True, stdin=subprocess.DEVNULL)
    reached(marker, "scaling")
    time.sleep(3600)
    return 0


@sky.compute(retries=1)
def lose_node_1_then_hold(marker: str, path: str) -> int:
    """A broadcast whose node 1 is lost the first time (its worker killed); run again once
    the replacement is up, it starts a daemon and a process in a session of its own on
    every node, says so and holds (returns at once for ``return``; node 1 raises for
    ``exception``)."""
    node = sky.instance_info().node
    if node == 1 and not os.path.exists(f"{marker}-killed"):
        open(f"{marker}-killed", "w").close()
        os.kill(os.getpid(), 9)
    subprocess.Popen([sys.executable, "-c", DAEMON], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL).wait()
    subprocess.Popen(["sleep", "3600"], start_new_session=True, stdin=subprocess.DEVNULL)
    reached(marker, "replaced")
    if path == "exception" and node == 1:
        raise ValueError("node 1 fails")
    if path != "return":
        time.sleep(3600)
    return node


def elastic(provider, image, cfg) -> None:
    """The elastic phases: ``scaling`` (a scale-up's new node is starting while node 0 runs
    the queued work) and ``replaced`` (a broadcast runs on a lost node's replacement)."""
    phase, path, marker = cfg["phase"], cfg["path"], cfg["marker"]
    plugins = [hold_plugin(cfg["tag"], marker, phase, path)]
    nodes = (1, 2) if phase == "scaling" else (2, 2)
    with sky.ComputePool(provider=provider, nodes=nodes, image=image, plugins=plugins, idle_timeout=3,
                         scale_up_after=0.5, console=False) as pool:
        print("open", flush=True)
        if phase == "scaling":
            held = [hold_on_node_0(marker) > pool for _ in range(3)]
            while not all(os.path.exists(f"{marker}-scaling-{n}") for n in (0, 1)):
                time.sleep(0.05)
            if path == "exception":
                raise RuntimeError("the program fails while the pool scales up")
            if path != "return":  # (a signal comes from outside)
                time.sleep(3600)
            del held  # return: leave the block with the scale-up under way
        else:
            assert lose_node_1_then_hold(marker, path) @ pool == [0, 1]
    print("closed", flush=True)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    phase, path, marker = cfg["phase"], cfg["path"], cfg["marker"]
    image = sky.Image()  # (the same for every case: the hosts' environment stays warm)
    if cfg["provider"] == "local":
        provider = None
    elif cfg["provider"] == "aws":
        from skyward.providers.aws.provider import AWS

        provider = AWS(**cfg["aws"])
    else:
        ssh = cfg["ssh"]
        provider = sky.SSH(ssh["hosts"], user=ssh["user"], key=ssh["key"], known_hosts=ssh["known_hosts"],
                           find_links=[ssh["wheelhouse"]], no_index=True, connect_timeout=5)
    if phase in ("scaling", "replaced"):
        elastic(provider, image, cfg)
        return
    if phase == "preparing" and provider is not None:  # the image's setup holds (its command line
        image = image.with_setup(f"touch {marker}-preparing-$(hostname)",  # carries the tag)
                                 f"python3 -c 'import time; time.sleep(3600)' {cfg['tag']}")
    with sky.ComputePool(provider=provider, nodes=2, image=image, plugins=[hold_plugin(cfg["tag"], marker, phase, path)],
                         idle_timeout=3, console=False) as pool:
        print("open", flush=True)
        task = run_then_hold(marker, phase, path)
        if path.endswith("-gather"):  # one task per node (the least busy node first)
            assert sky.gather(task, task) >> pool == [0, 1]
        elif path.endswith("-run"):  # node 0 busy with a `>` task: `>>` runs on node 1
            busy = task > pool
            assert task >> pool == 1 and busy.result() == 0
        else:
            assert task @ pool == [0, 1]
    print("closed", flush=True)


if __name__ == "__main__":
    main()
