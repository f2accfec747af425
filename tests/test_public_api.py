"""The public names are pinned; importing skyward stays light."""

from __future__ import annotations

import ast
import subprocess
import sys

import skyward as sky

PUBLIC = [
    "AWS", "BootstrapError", "CapacityError", "ClusterBusy", "ClusterError", "PoolInfo", "CommandFailed", "CommandResult", "ComputeFunction", "ComputePool", "ConfigError", "DeviceError",
    "ConnectionLost", "Image", "InstanceInfo", "Job", "JobError", "JobFailed", "JobTimeout", "Local", "PendingCompute", "PendingGather", "Peer",
    "Plugin", "PluginError", "Preemption", "ProvisionError", "RemoteError", "SSH", "Secret", "Slurm", "SerializationError", "SkywardError", "SlurmTimeLimit",
    "TaskCancelled", "TaskTimeout", "WorkerLost", "__version__", "compute", "gather", "instance_info", "integrations", "jobs", "on_preempt", "plugins",
    "shard", "shell", "silent", "stderr", "stdout",
]


def test_public_names_are_pinned() -> None:
    assert sorted(sky.__all__) == sorted(PUBLIC)
    assert sky.__all__ == sorted(sky.__all__)
    for name in PUBLIC:
        assert getattr(sky, name) is not None


def test_managed_jobs_from_python_are_sky_jobs() -> None:
    assert sorted(sky.jobs.__all__) == ["ManagedJob", "get", "launch", "list"]
    assert issubclass(sky.jobs.ManagedJob, sky.Job)


def test_errors_share_one_root() -> None:
    for name in PUBLIC:
        obj = getattr(sky, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, sky.SkywardError)
    assert issubclass(sky.WorkerLost, sky.ConnectionLost)
    assert issubclass(sky.CapacityError, sky.ProvisionError)
    assert issubclass(sky.JobFailed, sky.JobError) and issubclass(sky.JobTimeout, sky.JobError)
    assert issubclass(sky.JobTimeout, TimeoutError)


def test_import_skyward_loads_nothing_heavy() -> None:
    code = (
        "import sys, skyward, skyward.worker.agent, skyward.plugins\n"
        "heavy = [m for m in ('boto3', 'botocore', 'paramiko', 'torch', 'numpy', 'pandas', 'rich', 'pydantic')"
        " if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_compute_stays_the_decorator_after_its_module_is_imported() -> None:
    code = "import skyward.compute, skyward.pool, skyward as sky; print(callable(sky.compute), type(sky.compute).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "function"]


def test_the_worker_imports_only_what_it_needs() -> None:
    code = "import sys, skyward.worker.agent; print(sorted(m for m in sys.modules if m.startswith('skyward')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout))
    assert {"skyward.pool", "skyward.image", "skyward.integrations", "skyward.console"}.isdisjoint(loaded)


def test_no_public_name_is_shadowed_by_a_submodule_of_that_name() -> None:
    """Importing a submodule sets the package's attribute of that name to the module: a public
    function named like a submodule (``sky.shell`` and ``skyward/shell.py``) becomes the module
    once anything imports the submodule first, and ``sky.shell(...)`` then fails with "'module'
    object is not callable". ``compute`` is bound eagerly for that reason; no other may collide."""
    import importlib.util

    import skyward

    clashing = [name for name in skyward.__all__
                if name not in ("accelerators", "integrations", "jobs", "plugins", "compute")
                and importlib.util.find_spec(f"skyward.{name}") is not None]
    assert clashing == []


def _documented_paths() -> set[tuple[str, str]]:
    """``(module, name)`` for every ``from skyward... import name`` in a Python block of the
    README, the docs, the guides and the examples, and every ``::: skyward.x.Name`` reference."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found: set[tuple[str, str]] = set()
    texts = [root / "README.md", *(root / "docs").rglob("*.md"), *(root / "guides").rglob("*.py"),
             *(root / "examples").rglob("*.py")]
    for path in texts:
        text = path.read_text()
        for module, names in re.findall(r"^\s*from (skyward[\w.]*) import ([\w, ]+)$", text, re.M):
            found |= {(module, n.strip().split(" as ")[0]) for n in names.split(",") if n.strip()}
        for dotted in re.findall(r"^::: (skyward[\w.]+)$", text, re.M):
            module, _, name = dotted.rpartition(".")
            found.add((module, name))
    return found


def test_every_documented_import_path_works() -> None:
    """The paths users copy from the pages keep working however the package is laid out."""
    import importlib
    import importlib.util

    paths = _documented_paths()
    # the pages name these; the list shows that the scan reads them
    assert {("skyward.torch", "Compute"), ("skyward.runtime", "instance_info"), ("skyward.console", "Console"),
            ("skyward.pool", "ComputePool"), ("skyward.runtime", "shard")} <= paths
    missing = []
    for module, name in sorted(paths):
        try:
            loaded = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{module}: {exc}")
            continue
        if not hasattr(loaded, name) and importlib.util.find_spec(f"{module}.{name}") is None:
            missing.append(f"{module}.{name}")
    assert missing == []


def test_the_command_line_entry_points_work() -> None:
    """``skyward`` (pyproject's ``skyward.cli:run``) and ``python -m skyward.cli``."""
    from skyward.cli import main, run

    assert callable(main) and callable(run)
    out = subprocess.run([sys.executable, "-m", "skyward.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and sky.__version__ in out.stdout + out.stderr
