"""sky.plugins.torch without workers: what the image transform produces, argument checks,
the torchrun variables for each pool shape, and that importing the plugin never imports torch.

Internals on purpose: distributed_env, host_share, node_devices and setup_process_group are
checked directly (skyward.plugins._torch), for pool shapes (peers sharing a host, GPUs per
host) that a Local pool on this machine cannot make."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

import skyward as sky
from skyward.accelerators import Accelerator
from skyward import Plugin, PoolInfo
from skyward.plugins._torch import distributed_env, host_share, node_devices, requirement, setup_process_group
from skyward.runtime import InstanceInfo, Peer

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
OTHER_INDEX = "https://pypi.example.org/simple"

CPU = PoolInfo(nodes=2)
GPU = PoolInfo(nodes=2, accelerator=Accelerator("A100"))


def transform(plugin: Plugin, cluster: PoolInfo = CPU, image: sky.Image | None = None) -> sky.Image:
    assert plugin.transform is not None
    return plugin.transform(image or sky.Image(), cluster)


# -- transform: packages ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("latest", "torch"),
        ("2.3.0", "torch==2.3.0"),
        ("2.3.0+cu121", "torch==2.3.0+cu121"),
        (">=2.3", "torch>=2.3"),
        ("~=2.3", "torch~=2.3"),
        ("==2.4.1", "torch==2.4.1"),
        (">=2.3,<2.6", "torch>=2.3,<2.6"),
        ("!=2.5.0", "torch!=2.5.0"),
    ],
)
def test_torch_version_forms(version: str, expected: str) -> None:
    assert transform(sky.plugins.torch(version=version)).pip == (expected, "numpy")


@pytest.mark.parametrize(
    ("vision", "audio", "extra"),
    [
        (None, None, ()),
        ("latest", None, ("torchvision",)),
        (None, "latest", ("torchaudio",)),
        ("0.18.0", "2.3.0", ("torchvision==0.18.0", "torchaudio==2.3.0")),
        (">=0.18", "~=2.3", ("torchvision>=0.18", "torchaudio~=2.3")),
    ],
)
def test_vision_and_audio_follow_the_same_version_rules(vision, audio, extra) -> None:
    image = transform(sky.plugins.torch(version="2.3.0", vision=vision, audio=audio))
    assert image.pip == ("torch==2.3.0", *extra, "numpy")


def test_requirement_helper() -> None:
    assert requirement("torchvision", "latest") == "torchvision"
    assert requirement("torchvision", "0.18.0") == "torchvision==0.18.0"
    assert requirement("torchvision", "<0.19") == "torchvision<0.19"


# -- transform: index ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "index"),
    [
        (None, CPU_INDEX),                                                # no accelerator
        (Accelerator("A100"), "https://download.pytorch.org/whl/cu128"),  # cuda taken from KNOWN: True
        (Accelerator("T4", cuda=True), "https://download.pytorch.org/whl/cu128"),
        (Accelerator("Trainium"), CPU_INDEX),                             # cuda taken from KNOWN: False
        (Accelerator("my-npu", cuda=False), CPU_INDEX),
    ],
)
def test_index_follows_the_accelerator(accelerator, index) -> None:
    image = transform(sky.plugins.torch(), PoolInfo(nodes=1, accelerator=accelerator))
    assert image.pip_indexes == (index,)


@pytest.mark.parametrize("cuda", ["cu118", "cu121", "cu124", "cu126"])
def test_custom_cuda_suffix_selects_that_index_on_cuda_pools(cuda: str) -> None:
    plugin = sky.plugins.torch(cuda=cuda)
    assert transform(plugin, GPU).pip_indexes == (f"https://download.pytorch.org/whl/{cuda}",)
    assert transform(plugin, CPU).pip_indexes == (CPU_INDEX,)  # the suffix only matters with CUDA


def test_transform_keeps_what_the_image_and_earlier_plugins_added() -> None:
    other = Plugin("other", transform=lambda image, cluster: image.with_pip("pandas", index=OTHER_INDEX))
    plugins = [other, sky.plugins.torch(vision="latest")]
    image = sky.Image(pip=["numpy"], pip_indexes=["https://mirror.example.org/simple"], env={"A": "1"})
    for plugin in plugins:  # as the pool applies them: in list order
        assert plugin.transform is not None
        image = plugin.transform(image, GPU)
    assert image.pip == ("numpy", "pandas", "torch", "torchvision")
    assert image.pip_indexes == (
        "https://mirror.example.org/simple", OTHER_INDEX, "https://download.pytorch.org/whl/cu128",
    )
    assert dict(image.env) == {"A": "1"}


def test_later_plugins_keep_the_torch_packages() -> None:
    other = Plugin("other", transform=lambda image, cluster: image.with_pip("transformers", index=OTHER_INDEX))
    image = sky.Image()
    for plugin in (sky.plugins.torch(), other):
        assert plugin.transform is not None
        image = plugin.transform(image, CPU)
    assert image.pip == ("torch", "numpy", "transformers")
    assert image.pip_indexes == (CPU_INDEX, OTHER_INDEX)


@pytest.mark.parametrize("pinned", ["numpy", "numpy==1.26.4", "NumPy>=2"])
def test_numpy_comes_with_torch_unless_the_image_names_it(pinned: str) -> None:
    # Without numpy, `import torch` warns "Failed to initialize NumPy" on every node.
    assert "numpy" in transform(sky.plugins.torch()).pip
    image = transform(sky.plugins.torch(), image=sky.Image(pip=[pinned]))
    assert image.pip == (pinned, "torch")


def test_transform_is_pure() -> None:
    before = sky.Image(pip=["numpy"])
    after = transform(sky.plugins.torch(), image=before)
    assert before.pip == ("numpy",) and before.pip_indexes == ()
    assert after is not before


# -- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"backend": "mpi"}, "backend"),
        ({"backend": "NCCL"}, "backend"),
        ({"backend": 1}, "backend"),
        ({"cuda": "12.1"}, "cuda"),
        ({"cuda": "cu12"}, "cuda"),
        ({"cuda": "cuda121"}, "cuda"),
        ({"cuda": ""}, "cuda"),
        ({"cuda": None}, "cuda"),
        ({"version": ""}, "version"),
        ({"version": "   "}, "version"),
        ({"version": None}, "version"),
        ({"version": 2.3}, "version"),
        ({"version": "newest"}, "version"),
        ({"vision": ""}, "vision"),
        ({"vision": 18}, "vision"),
        ({"audio": ""}, "audio"),
        ({"audio": "the latest"}, "audio"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": -5}, "timeout"),
        ({"timeout": "600"}, "timeout"),
        ({"timeout": True}, "timeout"),
    ],
)
def test_invalid_arguments_raise_config_error_naming_the_parameter(kwargs, parameter) -> None:
    with pytest.raises(sky.ConfigError) as info:
        sky.plugins.torch(**kwargs)
    assert info.value.parameter == parameter


def test_valid_arguments_are_accepted() -> None:
    plugin = sky.plugins.torch(backend="gloo", cuda="cu118", version="2.3.0", vision="latest", audio=">=2.3",
                               timeout=30)
    assert plugin.name == "torch"
    assert plugin.around_app is not None and plugin.around_task is None and plugin.around_client is None


def test_plugin_pickles_by_reference() -> None:
    # The worker receives the plugin pickled; plain pickle proves the hooks are importable names.
    plugin = sky.plugins.torch(backend="gloo", vision="latest", timeout=12.5)
    clone = pickle.loads(pickle.dumps(plugin))
    assert clone.name == "torch"
    assert clone.around_app.keywords == {"backend": "gloo", "timeout": 12.5}  # type: ignore[union-attr]
    assert transform(clone, GPU).pip == ("torch", "torchvision", "numpy")


def test_decorator_validates_its_arguments() -> None:
    from skyward import integrations

    with pytest.raises(sky.ConfigError) as info:
        integrations.torch(backend="mpi")
    assert info.value.parameter == "backend"
    with pytest.raises(sky.ConfigError) as info:
        integrations.torch(timeout=-1)
    assert info.value.parameter == "timeout"
    with pytest.raises(sky.ConfigError):
        integrations.torch("gloo")  # type: ignore[call-overload]  # backend must be a keyword


def test_decorator_above_compute_is_rejected() -> None:
    from skyward import integrations

    with pytest.raises(sky.ConfigError, match="below @sky.compute"):
        integrations.torch(sky.compute(lambda: 1))


# -- the torchrun variables ----------------------------------------------------------------------


def test_one_process_per_node_gives_node_ranks() -> None:
    peers = (Peer(0, "10.0.0.1"), Peer(1, "10.0.0.2"), Peer(2, "10.0.0.3"))
    info = InstanceInfo(node=2, total_nodes=3, head_addr="10.0.0.1", head_port=29501, peers=peers, pool_id="p1")
    assert distributed_env(info) == {
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29501", "WORLD_SIZE": "3", "RANK": "2",
        "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "2", "NODE_RANK": "2",
        "TORCHELASTIC_RUN_ID": "p1",
    }


def test_several_processes_per_node_get_torchrun_ranks() -> None:
    peers = (Peer(0, "a"), Peer(1, "b"))
    envs = [distributed_env(InstanceInfo(node=n, total_nodes=2, head_addr="a", peers=peers, local_rank=r,
                                         processes_per_node=2)) for n in range(2) for r in range(2)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"], e["WORLD_SIZE"]) for e in envs] == [
        ("0", "0", "2", "0", "4"), ("1", "1", "2", "0", "4"), ("2", "0", "2", "1", "4"), ("3", "1", "2", "1", "4"),
    ]


def test_local_ranks_are_per_node_even_when_nodes_share_a_host() -> None:
    # The Local provider: every node on this host. LOCAL_RANK is per node, as torchrun sets
    # it; the host's CPUs and GPUs are shared out over every process on it (host_share).
    peers = tuple(Peer(i, "127.0.0.1") for i in range(3))
    infos = [InstanceInfo(node=n, total_nodes=3, head_port=4000, peers=peers, local_rank=r, processes_per_node=2)
             for n in range(3) for r in range(2)]
    envs = [distributed_env(i) for i in infos]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"] * 3 and {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert [host_share(i) for i in infos] == [(slot, 6) for slot in range(6)]


def test_nodes_sharing_a_host_with_gpus_each_see_their_own() -> None:
    peers = (Peer(0, "127.0.0.1"), Peer(1, "127.0.0.1"))
    infos = [InstanceInfo(node=n, total_nodes=2, peers=peers, local_rank=r, processes_per_node=2)
             for n in range(2) for r in range(2)]
    assert [node_devices(i, host_gpus=4) for i in infos] == ["0,1", "0,1", "2,3", "2,3"]
    assert node_devices(infos[0], host_gpus=3) is None  # too few to give every process one
    alone = InstanceInfo(node=1, total_nodes=2, peers=(Peer(0, "a"), Peer(1, "b")), processes_per_node=2)
    assert node_devices(alone, host_gpus=8) is None  # a host of its own: all its GPUs


def test_single_node_sets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    plugin = sky.plugins.torch()
    assert plugin.around_app is not None
    with plugin.around_app(InstanceInfo()):
        import torch.distributed as dist

        assert not dist.is_initialized()
    assert setup_process_group(InstanceInfo()) is False
    assert not any(name in os.environ for name in ("MASTER_ADDR", "RANK", "WORLD_SIZE"))


# -- light imports -------------------------------------------------------------------------------


def test_importing_and_using_the_plugin_on_the_client_does_not_import_torch() -> None:
    code = (
        "import sys, skyward as sky, skyward.integrations\n"
        "p = sky.plugins.torch(vision='latest')\n"
        "p.transform(sky.Image(), sky.PoolInfo(nodes=4))\n"
        "@skyward.integrations.torch\n"
        "def f(): return 1\n"
        "assert f() == 1\n"  # outside a pool: node 0 of 1, nothing to initialise
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
