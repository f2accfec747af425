"""SkyPilot task files: every field accepted, honoured, warned about or refused (with every reason
at once), pipelines, ``${VAR}`` in paths, and SkyPilot's minGPT recipe (``accelerators: L4:2``)
running on Local with worker processes standing in for the GPUs."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
from io import StringIO
from pathlib import Path

import pytest

import skyward as sky
from skyward import events as ev
from skyward.launch import execute, plan
from tests.conftest import venv_seeing_this_environment

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "task.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def cli(*args: str, cwd: Path = ROOT, timeout: float = 300, python: str = sys.executable,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([python, "-m", "skyward.cli", "launch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


# -- every field: (case, the file, what happens, the line that says so) ---------------------------------

H = "honoured"  # the plan shows it
W = "warned"    # accepted, and one warning line names the field
R = "refused"   # a problem line names the field

FIELDS = [
    ("name", "name: trainer\nrun: echo", H, "task 'trainer'"),
    ("num_nodes", "num_nodes: 3\nrun: echo", H, "3 node(s) on local"),
    ("num_nodes bad", "num_nodes: 0\nrun: echo", R, "num_nodes: expected an integer >= 1"),
    ("setup", "setup: pip list\nrun: echo", H, "setup:\n    pip list"),
    ("run missing", "setup: echo only", W, "run: none given"),
    ("run misspelt", "runn: echo", R, "runn: expected a known key: one of"),
    ("envs", "envs: {EPOCHS: 3, DEBUG: true}\nrun: echo", H, "env DEBUG=true"),
    ("envs null", "envs: {DATA: null}\nrun: echo", R, "envs['DATA']: expected a value: pass --env DATA=VALUE"),
    ("secrets", "secrets: {TOKEN: s3cr3t}\nrun: echo", H, "secret TOKEN=***"),
    ("secrets list", "secrets: [TOKEN]\nrun: echo", R, "secrets: expected a mapping {NAME: value}"),
    ("managed_secrets", "managed_secrets: [a]\nrun: echo", R, "managed_secrets: expected secrets given in the file"),
    ("workdir git", "workdir: {url: 'https://x/y.git', ref: v2}\nrun: echo", H, "workdir: git https://x/y.git at v2"),
    ("workdir git bad", "workdir: {ref: v2}\nrun: echo", R, "workdir.url: expected a git repository URL"),
    ("file_mounts s3", "file_mounts: {/d: 's3://b/x'}\nrun: echo", H, "bucket: s3://b/x -> /d (copied with boto3"),
    ("file_mounts storage", "file_mounts: {/d: {name: b, mode: COPY}}\nrun: echo", H, "bucket: s3://b -> /d"),
    ("file_mounts MOUNT", "file_mounts: {/d: {source: 's3://b', mode: MOUNT}}\nrun: echo", W,
     "mode MOUNT: mounted where the node has mount-s3, goofys, s3fs or rclone; a node with none copies it"),
    ("file_mounts MOUNT r2", "file_mounts: {/d: {source: 'r2://b', mode: MOUNT}}\nrun: echo", W,
     "mode MOUNT is copied (COPY): Skyward mounts no Cloudflare R2"),
    ("file_mounts store unknown", "file_mounts: {/d: {name: b, store: volume}}\nrun: echo", R,
     ".store: expected one of s3, gcs, r2"),
    ("file_mounts store azure by name", "file_mounts: {/d: {name: b, store: azure}}\nrun: echo", R,
     ".name: expected a `source` URL (https://ACCOUNT.blob.core.windows.net/CONTAINER)"),
    ("file_mounts name left empty", "file_mounts: {/d: {name: null, mode: MOUNT}}\nrun: echo", R,
     "leaves the bucket's name for you to fill in"),
    ("file_mounts placeholder", "file_mounts: {/d: {source: '<bucket-path-to-your-model>'}}\nrun: echo", R,
     "got '<bucket-path-to-your-model>' (the task file holds a placeholder for you to fill in)"),
    ("file_mounts unknown scheme", "file_mounts: {/d: 'ftp://h/x'}\nrun: echo", R,
     "expected a local path, or a bucket URL: s3://, gs://"),
    ("file_mounts sources list", "file_mounts: {/d: {source: ['.', '.'], name: b}}\nrun: echo", W,
     "the local sources are copied to every node directly, each under its own name"),
    ("service", "service: {replicas: 2}\nrun: echo", W, "service: ignored"),
    ("config", "config: {kubernetes: {}}\nrun: echo", W, "config: ignored"),
    ("pool", "pool: {workers: 2}\nrun: echo", W, "pool: ignored"),
    ("event_callback", "event_callback: echo\nrun: echo", W, "event_callback: ignored"),
    ("inputs", "inputs: {'s3://x': 1}\nrun: echo", W, "inputs: ignored"),
    ("volumes", "volumes: {/v: vol}\nrun: echo", W, "volumes: not honoured"),
    ("accelerators", "resources: {accelerators: L4:2}\nrun: echo", H, "2 node(s) x 2 worker processes"[2:]),
    ("accelerators dict", "resources: {accelerators: {A100: 8}}\nrun: echo", H, "standing in for A100:8"),
    ("accelerators set", "resources: {accelerators: {L4:1, A10G:1}}\nrun: echo", W, "the first of 2 candidates"),
    ("accelerators list", "resources: {accelerators: [A100, H100]}\nrun: echo", W, "the first of 2 candidates"),
    ("accelerators fractional", "resources: {accelerators: T4:0.5}\nrun: echo", W,
     "resources.accelerators: T4:0.5: a worker has whole devices, so this task gets 1"),
    ("accelerators fractional plan", "resources: {accelerators: {T4: 1.5}}\nrun: echo", H, "standing in for T4:2"),
    ("accelerators tpu", "resources: {accelerators: tpu-v2-8}\nrun: echo", R, "TPUs are Google Cloud's"),
    ("accelerators unknown", "resources: {accelerators: Z80}\nrun: echo", R, "unknown accelerator 'Z80'"),
    ("any_of", "resources: {any_of: [{accelerators: L4:1}, {accelerators: A10G:1}]}\nrun: echo", W,
     "the first of 2 candidates"),
    ("ordered", "resources: {ordered: [{accelerators: H100:1}, {accelerators: A100:1}]}\nrun: echo", H,
     "standing in for H100:1"),
    ("cpus", "resources: {cpus: 4+}\nrun: echo", H, "asked: cpus=4+"),
    ("memory", "resources: {memory: 32+}\nrun: echo", H, "memory=32+"),
    ("cpus bad", "resources: {cpus: lots}\nrun: echo", R, 'resources.cpus: expected a number such as 8'),
    ("instance_type", "resources: {instance_type: g6.xlarge}\nrun: echo", W, "instance_type: not honoured on Local"),
    ("use_spot", "resources: {use_spot: true}\nrun: echo", W, "use_spot: not honoured on Local"),
    ("infra aws", "resources: {infra: aws/us-west-2}\nrun: echo", H, "on aws"),
    ("infra other cloud", "resources: {infra: gcp}\nrun: echo", W, "gcp is not a provider Skyward has"),
    ("infra bad", "resources: {infra: mars}\nrun: echo", R, "resources.infra: expected a cloud"),
    ("cloud", "resources: {cloud: lambda}\nrun: echo", W, "lambda is not a provider Skyward has"),
    ("region", "resources: {region: eu-west-1}\nrun: echo", W, "region: not honoured on Local"),
    ("zone", "resources: {zone: us-east-1a}\nrun: echo", W, "zone: not honoured on Local"),
    ("disk_size", "resources: {disk_size: 256}\nrun: echo", W, "disk_size: not honoured on Local"),
    ("disk_size aws", "resources: {infra: aws, disk_size: 256, disk_tier: high}\nrun: echo", H,
     "root disk 256 GB, tier high"),
    ("disk_tier bad", "resources: {disk_tier: fast}\nrun: echo", R, "disk_tier: expected one of low, medium"),
    ("ports aws", "resources: {infra: aws, ports: [8000, '9000-9010']}\nrun: echo", H, "ports 8000, 9000-9010"),
    ("ports bad", "resources: {ports: 70000}\nrun: echo", R, "resources.ports: expected ports 1-65535"),
    ("network_tier", "resources: {network_tier: best}\nrun: echo", W, "network_tier: not honoured"),
    ("labels", "resources: {labels: {team: ml}}\nrun: echo", W, "labels: not honoured on Local"),
    ("labels ssh", "resources: {labels: {team: ml}}\nrun: echo", "ssh", "labels: not honoured on SSH hosts"),
    ("image_id docker", "resources: {image_id: 'docker:ubuntu:22.04'}\nrun: echo", H, "image: docker:ubuntu:22.04"),
    ("image_id ami local", "resources: {image_id: ami-0123456789abcdef0}\nrun: echo", W,
     "image_id: not honoured on local"),
    ("image_id skypilot", "resources: {image_id: 'skypilot:gpu-ubuntu-2204'}\nrun: echo", W,
     "SkyPilot's own images are not used"),
    ("autostop", "resources: {autostop: {idle_minutes: 10, down: true}}\nrun: echo", H,
     "autostop: after 10 idle minute(s), then down"),
    ("autostop time", "resources: {autostop: 2h}\nrun: echo", H, "autostop: after 120 idle minute(s)"),
    ("autostop bad", "resources: {autostop: soon}\nrun: echo", R, "resources.autostop: expected idle minutes"),
    ("job_recovery", "resources: {job_recovery: FAILOVER}\nrun: echo", H,
     "job recovery: a lost or preempted node is replaced and the run restarted on every node"),
    ("spot_recovery", "resources: {spot_recovery: failover}\nrun: echo", H, "job recovery: a lost or preempted"),
    ("job_recovery restarts", "resources: {job_recovery: {max_restarts_on_errors: 3, recover_on_exit_codes: [29]}}"
     "\nrun: echo", H, "a failed run is restarted up to 3 time(s); and always on exit code(s) 29"),
    ("job_recovery none", "resources: {job_recovery: none}\nrun: echo", "plan-has-no", "job recovery"),
    ("job_recovery next region", "resources: {job_recovery: EAGER_NEXT_REGION}\nrun: echo", W,
     "EAGER_NEXT_REGION: a replacement comes from the pool's own region"),
    ("job_recovery bad restarts", "resources: {job_recovery: {max_restarts_on_errors: -1}}\nrun: echo", R,
     "resources.job_recovery.max_restarts_on_errors: expected a whole number >= 0"),
    ("job_recovery bad codes", "resources: {job_recovery: {recover_on_exit_codes: [0]}}\nrun: echo", R,
     "resources.job_recovery.recover_on_exit_codes: expected a list of exit codes (1 to 255)"),
    ("job_recovery bad strategy", "resources: {job_recovery: LATER}\nrun: echo", R,
     "resources.job_recovery.strategy: expected one of EAGER_NEXT_REGION, FAILOVER, NONE"),
    ("job_recovery unknown key", "resources: {job_recovery: {max_restart_on_errors: 2}}\nrun: echo", R,
     "did you mean 'max_restarts_on_errors'"),
    ("accelerator_args", "resources: {accelerator_args: {tpu_vm: true}}\nrun: echo", W,
     "accelerator_args: not honoured"),
    ("priority", "resources: {priority: 5}\nrun: echo", W, "priority: not honoured"),
    ("max_hourly_cost", "resources: {max_hourly_cost: 3.5}\nrun: echo", W, "max_hourly_cost: not honoured"),
    ("local_disk", "resources: {local_disk: 'nvme+'}\nrun: echo", W, "local_disk: not honoured"),
    ("ephemeral_storage", "resources: {ephemeral_storage: 10}\nrun: echo", W, "ephemeral_storage: not honoured"),
    ("resources unknown", "resources: {gpus: H100:8}\nrun: echo", R, "resources.gpus: expected a known key"),
    ("job group", "name: g\nexecution: parallel\n---\nrun: echo\n---\nrun: echo", R,
     "a job group runs its tasks at the same time, each reaching the others by name (TASK-0.GROUP)"),
    ("pipeline", "name: p\n---\nname: a\nrun: echo a\n---\nname: b\nrun: echo b", H, "pipeline stage 2 of 2"),
]


@pytest.mark.parametrize(("case", "text", "kind", "line"), FIELDS, ids=[f[0] for f in FIELDS])
def test_every_field_is_honoured_warned_about_or_refused_with_a_line_saying_so(
        tmp_path: Path, case: str, text: str, kind: str, line: str) -> None:
    task = write(tmp_path, text + "\n")
    if kind == "ssh":  # a warning where the task runs on SSH hosts
        said = list(plan(task, provider="ssh", hosts=["me@192.0.2.1"]).warnings)
    elif kind == R:
        with pytest.raises(sky.ConfigError) as info:
            plan(task)
        said = [p.line() for p in info.value.problems]
    else:
        p = plan(task)
        said = list(p.warnings) if kind == W else [p.describe()]
    print(f"{case}: {kind}: " + " | ".join(said))
    if kind == "plan-has-no":  # accepted, and the plan says nothing of it
        assert not any(line in text_ for text_ in said), said
        return
    assert any(line in text_ for text_ in said), said


def test_every_problem_in_a_file_is_reported_at_once_one_line_each(tmp_path: Path) -> None:
    task = write(tmp_path, """
        runn: echo
        num_nodes: many
        envs: {9LIVES: x}
        resources: {accelerators: tpu-v2-8, disk_tier: fast, disk: 3}
        file_mounts: {/d: 'ftp://b'}
    """)
    done = cli(str(task), "--dryrun")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert "6 problems in the task file" in lines[0] or "7 problems in the task file" in lines[0], lines
    for field in ("runn:", "num_nodes:", "envs['9LIVES']:", "resources.accelerators:", "resources.disk_tier:",
                  "resources.disk:", "file_mounts['/d']:"):
        assert sum(line.strip().startswith(field) for line in lines) == 1, (field, lines)
    assert "did you mean 'run'?" in done.stderr and "did you mean 'disk_tier'?" in done.stderr


def test_a_yaml_error_says_where_and_what_the_line_holds(tmp_path: Path) -> None:
    task = write(tmp_path, "run: |\n  echo\nresources:\n  cpus: 4\n\tmemory: 8\n")
    done = cli(str(task), "--dryrun")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "line 5" in done.stderr and "tab" in done.stderr


def test_variables_from_envs_are_substituted_in_workdir_and_file_mounts(tmp_path: Path) -> None:
    (tmp_path / "code-v2").mkdir()
    (tmp_path / "data-v2.txt").write_text("x")
    task = write(tmp_path, f"""
        envs: {{VERSION: v1, BUCKET: my-bucket}}
        workdir: {tmp_path}/code-$VERSION
        file_mounts:
          /data/${{VERSION}}.txt: {tmp_path}/data-${{VERSION}}.txt
          /remote: {{name: $BUCKET, mode: COPY}}
        run: echo
    """)
    with pytest.raises(sky.ConfigError) as info:
        plan(task)
    assert "code-v1" in str(info.value) and "data-v1.txt" in str(info.value)
    p = plan(task, env=["VERSION=v2"])
    assert p.workdir == str(tmp_path / "code-v2")
    assert p.file_mounts == {"/data/v2.txt": str(tmp_path / "data-v2.txt")}
    assert [(b.dest, b.url) for b in p.buckets] == [("/remote", "s3://my-bucket")]


def test_a_pipeline_runs_its_tasks_in_order_and_stops_at_the_first_failure(tmp_path: Path) -> None:
    task = write(tmp_path, f"""
        name: pipe
        ---
        name: prepare
        run: echo prepared > {tmp_path}/one.txt
        ---
        name: train
        num_nodes: 2
        run: |
          cat {tmp_path}/one.txt
          touch {tmp_path}/ran-$SKYPILOT_NODE_RANK
          for _ in $(seq 600); do [ -e {tmp_path}/ran-0 ] && [ -e {tmp_path}/ran-1 ] && break; sleep 0.1; done
          exit 4
        ---
        name: evaluate
        run: touch {tmp_path}/never.txt
    """)
    p = plan(task)
    assert [s.name for s in p.stages] == ["prepare", "train", "evaluate"] and p.stages[1].nodes == 2
    lines: list[str] = []

    def on_event(event: ev.Event) -> None:
        if isinstance(event, ev.TaskOutput):
            lines.append(event.line)

    err = StringIO()
    code = execute(p, console=False, on_event=on_event, err=err)
    assert code == 4, err.getvalue()
    # the second stage ran on both of its nodes (each fails only once both have printed: a
    # failed node gives the others 2 s, which a node started late on a busy machine can miss)
    assert lines.count("prepared") == 2
    assert "pipeline stopped at stage 2 of 3 (train)" in err.getvalue()
    assert not (tmp_path / "never.txt").exists()


# -- GPU recipes on this machine ----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_skypilots_mingpt_recipe_runs_on_local_with_two_processes_per_node_standing_in_for_l4_2(
        tmp_path: Path) -> None:
    # SkyPilot's minGPT recipe as it ships (resources and the torchrun line), on the repository's
    # example script; a free port instead of 8008, as tests run side by side.
    task = write(tmp_path, f"""
        name: minGPT-ddp
        resources:
          cpus: 4+
          accelerators: L4:2
        num_nodes: 2
        workdir: {ROOT}
        envs: {{MINGPT_STEPS: 6, PORT: {free_port()}}}
        run: |
          cd examples/mingpt
          MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
          torchrun \\
          --nnodes=$SKYPILOT_NUM_NODES \\
          --nproc_per_node=$SKYPILOT_NUM_GPUS_PER_NODE \\
          --master_addr=$MASTER_ADDR \\
          --master_port=$PORT \\
          --node_rank=${{SKYPILOT_NODE_RANK}} \\
          main.py
    """)
    dry = cli(str(task), "--dryrun", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    warning = "L4:2 on Local: 2 worker process(es) per node stand in for the GPUs"
    assert warning in dry.stdout and "2 node(s) x 2 worker processes on this machine" in dry.stdout
    done = cli(str(task), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(warning) == 1  # the run prints the plan the dry run printed
    assert "mingpt: world of 4 rank(s) on 2 node(s); all_reduce saw ranks [0, 1, 2, 3]" in done.stdout
    assert "weights identical on every rank" in done.stdout


def test_the_run_block_on_local_finds_the_tools_of_the_workers_environment(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv_seeing_this_environment(venv)  # (from a fresh venv too, as CI runs the suite)
    tool = venv / "bin" / "only-in-the-venv"
    tool.write_text("#!/bin/sh\necho the venv tool ran\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    task = write(tmp_path, "run: only-in-the-venv\n")
    # The virtualenv is not activated: its bin/ is not on PATH, as when its python is run by path.
    done = cli(str(task), cwd=tmp_path, python=str(venv / "bin" / "python"), env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the venv tool ran" in done.stdout


def test_gpus_flag_and_the_dry_run_agree_with_the_run_on_local(tmp_path: Path) -> None:
    task = write(tmp_path, 'num_nodes: 1\nrun: echo "gpus=$SKYPILOT_NUM_GPUS_PER_NODE"\n')
    done = cli(str(task), "--gpus", "A100:3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "gpus=3" in done.stdout and done.stdout.count("[node 0] gpus=3") == 1  # run once per node


def test_a_docker_image_is_refused_on_local_where_neither_docker_nor_podman_exists(tmp_path: Path) -> None:
    task = write(tmp_path, "resources: {image_id: 'docker:nvcr.io/nvidia/pytorch:24.07-py3'}\nrun: nvidia-smi\n")
    done = cli(str(task), "--dryrun", cwd=tmp_path, env={"PATH": str(tmp_path)})  # no docker, no podman
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "resources.image_id: expected docker:IMAGE where docker or podman is installed" in done.stderr
    assert "neither docker nor podman" in done.stderr


def test_a_docker_image_runs_setup_and_run_in_that_container(tmp_path: Path) -> None:
    # A stand-in `docker` that records its arguments and runs the command: what the node runs.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text('#!/bin/bash\necho "docker $*" >> "$DOCKER_LOG"\neval "${@: -1}"\n')
    fake.chmod(0o755)
    task = write(tmp_path, "resources: {image_id: 'docker:ubuntu:22.04'}\nsetup: echo set\nrun: echo ran\n")
    done = cli(str(task), cwd=tmp_path, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "DOCKER_LOG": str(tmp_path / "log")})
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "log").read_text().splitlines()
    assert len(calls) == 2 and all(c.startswith("docker run --rm --network host") for c in calls)
    assert all("ubuntu:22.04 bash -c" in c and "-e SKYPILOT_NODE_RANK" in c for c in calls)
    assert "[node 0] set" in done.stdout and "[node 0] ran" in done.stdout


def test_a_docker_images_blocks_reach_the_container_as_input_not_on_its_command_line(tmp_path: Path) -> None:
    # Blocks of 30,000 lines (over 300 KB; one command-line argument holds at most 128 KiB): the
    # stand-in `docker` runs its command as docker would, with the input docker -i passes on.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "docker"
    fake.write_text('#!/bin/bash\necho "docker $*" >> "$DOCKER_LOG"\neval "${@: -1}"\n')
    fake.chmod(0o755)
    body = "".join(f"  echo line {i}\n" for i in range(30_000))
    task = write(tmp_path, "resources: {image_id: 'docker:ubuntu:22.04'}\n"
                           f"setup: |\n  echo set-start\n{body}  echo set-end\nrun: |\n  echo run-start\n{body}  echo run-end\n")
    done = cli(str(task), cwd=tmp_path, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "DOCKER_LOG": str(tmp_path / "log")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert all(f"[node 0] {word}" in done.stdout for word in ("set-end", "run-end", "line 29999"))
    calls = (tmp_path / "log").read_text().splitlines()
    assert len(calls) == 2 and all(len(c) < 4096 and "line 1" not in c for c in calls)


def test_aws_resources_configure_the_provider_the_run_uses(tmp_path: Path) -> None:
    from skyward.launch import make_provider

    task = write(tmp_path, """
        resources:
          infra: aws/eu-west-1/eu-west-1b
          image_id: {us-east-1: ami-0aaaaaaaaaaaaaaaa, eu-west-1: ami-0bbbbbbbbbbbbbbbb}
          disk_size: 300
          disk_tier: low
          ports: 8080
          use_spot: true
          accelerators: A10G:1
        run: echo
    """)
    p = plan(task)
    made = make_provider(p)
    assert isinstance(made, sky.AWS) and made.region == "eu-west-1" and made.zone == "eu-west-1b"
    assert (made.ami, made.disk_gb, made.disk_tier, made.ports, made.allocation) == (
        "ami-0bbbbbbbbbbbbbbbb", 300, "low", ((8080, 8080),), "spot")


def test_autostop_is_on_the_parsed_task_for_named_clusters(tmp_path: Path) -> None:
    from skyward.launch.taskfile.file import read_tasks

    _, tasks, found = read_tasks(write(tmp_path, "resources: {autostop: {idle_minutes: 30, down: true}}\nrun: x\n"))
    assert not found.problems and (tasks[0].autostop.idle_minutes, tasks[0].autostop.down) == (30.0, True)
    assert plan(write(tmp_path, "resources: {autostop: false}\nrun: x\n", "off.yaml")).autostop is None


def test_a_git_workdir_is_cloned_at_its_ref_and_setup_and_run_start_there(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "--quiet", str(repo)], check=True)
    (repo / "version.txt").write_text("one\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "--quiet", "-m", "one"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "version.txt").write_text("two\n")
    subprocess.run([*git, "commit", "--quiet", "-am", "two"], check=True)
    task = write(tmp_path, f"""
        num_nodes: 2
        workdir: {{url: "{repo}", ref: {first}}}
        run: echo "$(cat version.txt) in $(basename $(dirname $PWD))"
    """)
    done = cli(str(task), cwd=tmp_path, env={"HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[node 0] one in workdirs" in done.stdout and "[node 1] one in workdirs" in done.stdout
