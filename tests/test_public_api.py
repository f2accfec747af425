"""The public names are pinned; importing skyward stays light."""

from __future__ import annotations

import ast
import subprocess
import sys

import skyward as sky

PUBLIC = [
    "AWS", "BootstrapError", "CapacityError", "ClusterBusy", "ClusterError", "PoolInfo", "CommandFailed", "CommandResult", "ComputeFunction", "ComputePool", "ConfigError", "DeviceError",
    "ConnectionLost", "Image", "InstanceInfo", "Local", "PendingCompute", "PendingGather", "Peer",
    "Plugin", "PluginError", "Preemption", "ProvisionError", "RemoteError", "SSH", "Secret", "SerializationError", "SkywardError",
    "TaskCancelled", "TaskTimeout", "WorkerLost", "__version__", "compute", "gather", "instance_info", "integrations", "on_preempt", "plugins",
    "shard", "shell", "silent", "stderr", "stdout",
]


def test_public_names_are_pinned() -> None:
    assert sorted(sky.__all__) == sorted(PUBLIC)
    assert sky.__all__ == sorted(sky.__all__)
    for name in PUBLIC:
        assert getattr(sky, name) is not None


def test_errors_share_one_root() -> None:
    for name in PUBLIC:
        obj = getattr(sky, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, sky.SkywardError)
    assert issubclass(sky.WorkerLost, sky.ConnectionLost)
    assert issubclass(sky.CapacityError, sky.ProvisionError)


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
                if name not in ("accelerators", "integrations", "plugins", "compute")
                and importlib.util.find_spec(f"skyward.{name}") is not None]
    assert clashing == []
