"""The framework plugins: jax, keras, huggingface, joblib, sklearn.

Unit tests check what each hook produces (packages, env, validation, secrecy); pool tests run
real 2-node Local pools (real worker processes) and check what a task sees on every node.

One internal on purpose: ``skyward.plugins._jax.distributed_env``, for a pool shape (GPUs per
node, a coordinator on another host) that a Local pool on this machine cannot make.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import cloudpickle
import pytest

import skyward as sky
from skyward import events as ev
from skyward.runtime import InstanceInfo, Peer

ROOT = Path(__file__).resolve().parent.parent
CUDA = types.SimpleNamespace(cuda=True)
CPU = types.SimpleNamespace(cuda=False)
JAX_VARS = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_LOCAL_DEVICE_COUNT")
HAVE_JAX = importlib.util.find_spec("jax") is not None
# Looks like a real token, and is unique enough that finding it anywhere means it leaked.
TOKEN = "hf_SkywardTestTokenDoNotLeak7f3a9c1e"


def two_node_info(node: int) -> InstanceInfo:
    peers = (Peer(0, "10.0.0.1"), Peer(1, "10.0.0.2"))
    return InstanceInfo(node=node, total_nodes=2, head_addr="10.0.0.1", head_port=29500,
                        accelerators=4, peers=peers)


# -- importing is light ---------------------------------------------------------------------------


def test_building_every_plugin_imports_no_framework() -> None:
    code = textwrap.dedent(
        """
        import sys
        import skyward as sky
        plugins = [sky.plugins.jax(), sky.plugins.keras(backend="torch"),
                   sky.plugins.huggingface(token="x"), sky.plugins.joblib(), sky.plugins.sklearn()]
        image = sky.Image()
        for p in plugins:
            image = p.transform(image, sky.PoolInfo(nodes=2))
        heavy = ("jax", "keras", "tensorflow", "torch", "transformers", "joblib", "sklearn")
        print(sorted(m for m in heavy if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- jax ------------------------------------------------------------------------------------------


def test_jax_transform_picks_cuda_or_cpu_wheels_and_keeps_what_was_there() -> None:
    base = sky.Image(pip=["numpy"])
    cuda = sky.plugins.jax().transform(base, sky.PoolInfo(nodes=2, accelerator=CUDA))
    cpu = sky.plugins.jax().transform(base, sky.PoolInfo(nodes=2, accelerator=CPU))
    none = sky.plugins.jax().transform(base, sky.PoolInfo(nodes=2))
    assert cuda.pip == ("numpy", "jax[cuda12]")
    assert cpu.pip == none.pip == ("numpy", "jax")
    assert base.pip == ("numpy",)  # images are values
    # An explicit choice wins over the pool's accelerator.
    assert sky.plugins.jax(cuda=False).transform(base, sky.PoolInfo(nodes=2, accelerator=CUDA)).pip[-1] == "jax"
    assert sky.plugins.jax(cuda=True).transform(base, sky.PoolInfo(nodes=2)).pip[-1] == "jax[cuda12]"


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [({"cuda": "yes"}, "cuda"), ({"port_offset": 0}, "port_offset"), ({"port_offset": True}, "port_offset"),
     ({"timeout": 0}, "timeout"), ({"initialize": "no"}, "initialize")],
)
def test_jax_rejects_bad_arguments(kwargs: dict, parameter: str) -> None:
    with pytest.raises(sky.ConfigError) as err:
        sky.plugins.jax(**kwargs)
    assert err.value.parameter == parameter


def test_jax_distributed_env_uses_a_port_of_its_own() -> None:
    from skyward.plugins._jax import distributed_env

    assert distributed_env(two_node_info(1)) == {
        "JAX_COORDINATOR_ADDRESS": "10.0.0.1:29501",  # torch.distributed has 29500
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "1",
        "JAX_LOCAL_DEVICE_COUNT": "4",
    }
    no_gpu = InstanceInfo(node=0, total_nodes=3, head_addr="h", head_port=100, accelerators=0)
    assert distributed_env(no_gpu, port_offset=7)["JAX_COORDINATOR_ADDRESS"] == "h:107"
    assert distributed_env(no_gpu)["JAX_LOCAL_DEVICE_COUNT"] == "1"


def test_jax_exports_its_variables_on_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in JAX_VARS:
        monkeypatch.delenv(var, raising=False)  # Local workers inherit this environment

    @sky.compute
    def seen() -> tuple[dict[str, str | None], str]:
        info = sky.instance_info()
        return {v: os.environ.get(v) for v in JAX_VARS}, f"{info.head_addr}:{info.head_port + 1}"

    plugin = sky.plugins.jax(initialize=False)  # the variables only: no jax needed
    with sky.ComputePool(nodes=2, plugins=[plugin], console=False) as pool:
        results = seen() @ pool
    for node, (env, coordinator) in enumerate(results):
        assert env == {
            "JAX_COORDINATOR_ADDRESS": coordinator,
            "JAX_NUM_PROCESSES": "2",
            "JAX_PROCESS_ID": str(node),
            "JAX_LOCAL_DEVICE_COUNT": "1",
        }


def test_jax_on_one_node_sets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in JAX_VARS:
        monkeypatch.delenv(var, raising=False)

    @sky.compute
    def seen() -> list[str]:
        return [v for v in JAX_VARS if v in os.environ]

    # initialize=True: were it attempted, a missing jax or a lonely coordinator would show.
    with sky.ComputePool(nodes=1, plugins=[sky.plugins.jax()], console=False) as pool:
        assert (seen() >> pool) == []


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not installed (pip install jax)")
def test_jax_distributed_spans_both_nodes() -> None:
    @sky.compute
    def topology() -> tuple[int, int, int, list[int]]:
        import jax
        import jax.numpy as jnp
        import numpy as np
        from jax.experimental import multihost_utils

        everyone = multihost_utils.process_allgather(jnp.array([jax.process_index() * 10]))
        return jax.process_index(), jax.process_count(), len(jax.devices()), np.asarray(everyone).ravel().tolist()

    with sky.ComputePool(nodes=2, plugins=[sky.plugins.jax(timeout=60)], console=False) as pool:
        results = topology() @ pool
    assert results == [(0, 2, 2, [0, 10]), (1, 2, 2, [0, 10])]


def test_local_rendezvous_leaves_the_ports_above_free_and_out_of_the_ephemeral_range() -> None:
    # jax's coordinator listens on head_port + 1: a port the kernel hands out for outgoing
    # connections could be taken between the choice and the listen (seen in CI: "Failed to
    # start RPC server"), so the Local provider's rendezvous ports lie below that range.
    import socket

    from skyward.providers.base import PoolSpec

    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    for _ in range(20):
        port = sky.Local().rendezvous_port(PoolSpec(pool_id="ports", nodes=2))
        assert port + 8 <= ephemeral_low
        for above in range(port, port + 8):
            with socket.socket() as s:
                s.bind(("127.0.0.1", above))  # each is free now


def test_jax_missing_on_a_node_fails_the_pool_start_naming_the_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in that shadows any real jax on the workers' import path and cannot be imported.
    (tmp_path / "jax.py").write_text("raise ImportError('no jax on this node')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(sky.PluginError) as err:
        with sky.ComputePool(nodes=2, plugins=[sky.plugins.jax(timeout=5)], console=False, start_timeout=30):
            pass
    assert err.value.plugin == "jax"
    assert err.value.hook == "around_app"
    assert "needs jax on every node" in str(err.value)


# -- keras ----------------------------------------------------------------------------------------


def test_keras_transform_adds_keras_and_the_backend_variable() -> None:
    image = sky.plugins.keras(backend="torch").transform(sky.Image(pip=["numpy"]), sky.PoolInfo(nodes=2))
    assert image.pip == ("numpy", "keras")
    assert dict(image.env) == {"KERAS_BACKEND": "torch"}
    assert sky.plugins.keras().transform(sky.Image(), sky.PoolInfo(nodes=1)).env["KERAS_BACKEND"] == "jax"


@pytest.mark.parametrize("backend", ["theano", "JAX", "", None, 3])
def test_keras_rejects_unknown_backends(backend: object) -> None:
    with pytest.raises(sky.ConfigError) as err:
        sky.plugins.keras(backend=backend)  # type: ignore[arg-type]
    assert err.value.parameter == "backend"
    assert '"jax", "torch" or "tensorflow"' in str(err.value)


def test_keras_around_app_sets_the_backend_and_warns_if_keras_came_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    plugin = sky.plugins.keras(backend="jax")
    with plugin.around_app(InstanceInfo()):
        assert os.environ["KERAS_BACKEND"] == "jax"
    assert "KERAS_BACKEND" not in os.environ  # put back as it was
    assert capsys.readouterr().err == ""

    fake = types.ModuleType("keras")
    fake.backend = types.SimpleNamespace(backend=lambda: "tensorflow")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "keras", fake)
    with plugin.around_app(two_node_info(1)):
        pass
    err = capsys.readouterr().err
    assert "already imported on node 1 with backend 'tensorflow'" in err


def test_keras_backend_is_set_before_keras_is_imported_on_every_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in keras that records the variable at import time, as Keras 3 reads it. It is
    # ahead of site-packages on the workers' path, so it is what `import keras` finds there.
    (tmp_path / "keras").mkdir()
    (tmp_path / "keras" / "__init__.py").write_text(
        "import os\nBACKEND_AT_IMPORT = os.environ.get('KERAS_BACKEND')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("KERAS_BACKEND", raising=False)  # Local workers inherit this environment

    @sky.compute
    def backend_seen_by_keras() -> tuple[str | None, str]:
        import keras

        return keras.BACKEND_AT_IMPORT, keras.__file__

    with sky.ComputePool(nodes=2, plugins=[sky.plugins.keras(backend="torch")], console=False) as pool:
        results = backend_seen_by_keras() @ pool
    for backend, path in results:
        assert path.startswith(str(tmp_path))
        assert backend == "torch"


# -- huggingface ----------------------------------------------------------------------------------


def test_huggingface_transform_installs_packages_and_sets_the_token() -> None:
    plugin = sky.plugins.huggingface(token=f"  {TOKEN}\n")
    image = plugin.transform(sky.Image(pip=["numpy"]), sky.PoolInfo(nodes=2))
    assert image.pip == ("numpy", "transformers", "datasets", "tokenizers")
    assert image.env["HF_TOKEN"] == TOKEN  # stripped
    assert TOKEN not in repr(image)
    assert TOKEN not in repr(plugin) and TOKEN not in str(plugin)
    assert "***" in repr(plugin)

    public = sky.plugins.huggingface(packages=["transformers==4.44.0"])
    image = public.transform(sky.Image(), sky.PoolInfo(nodes=1))
    assert image.pip == ("transformers==4.44.0",)
    assert "HF_TOKEN" not in image.env
    assert sky.plugins.huggingface(token=TOKEN, packages=()).transform(sky.Image(), sky.PoolInfo(1)).pip == ()


@pytest.mark.parametrize("token", [TOKEN.encode(), 12345678901234, "   ", [TOKEN]])
def test_huggingface_bad_token_errors_never_show_the_value(token: object) -> None:
    with pytest.raises(sky.ConfigError) as err:
        sky.plugins.huggingface(token=token)  # type: ignore[arg-type]
    assert err.value.parameter == "token"
    for text in (str(err.value), repr(err.value), repr(err.value.got)):
        assert TOKEN not in text and "12345678901234" not in text


@pytest.mark.parametrize("packages", ["transformers", [""], [3], None])
def test_huggingface_rejects_bad_packages(packages: object) -> None:
    with pytest.raises(sky.ConfigError) as err:
        sky.plugins.huggingface(packages=packages)  # type: ignore[arg-type]
    assert err.value.parameter == "packages"


def test_huggingface_token_travels_pickled_and_is_exported_by_around_app(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    plugin = cloudpickle.loads(cloudpickle.dumps(sky.plugins.huggingface(token=TOKEN)))
    assert TOKEN not in repr(plugin)
    with plugin.around_app(InstanceInfo()):
        assert os.environ["HF_TOKEN"] == os.environ["HUGGING_FACE_HUB_TOKEN"] == TOKEN
    assert "HF_TOKEN" not in os.environ and "HUGGING_FACE_HUB_TOKEN" not in os.environ
    with sky.plugins.huggingface().around_app(InstanceInfo()):
        assert "HF_TOKEN" not in os.environ


def test_huggingface_token_reaches_tasks_but_never_the_output(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)  # Local workers inherit this environment
    events: list[ev.Event] = []

    @sky.compute
    def check() -> bool:
        print(f"node {sky.instance_info().node}: env names {sorted(k for k in os.environ if 'HF' in k or 'HUGGING' in k)}")
        return os.environ["HF_TOKEN"] == TOKEN and os.environ["HUGGING_FACE_HUB_TOKEN"] == TOKEN

    plugin = sky.plugins.huggingface(token=TOKEN, packages=())
    # console=True: whatever the console shows (stages, task output) is in the captured output.
    with sky.ComputePool(nodes=2, plugins=[plugin], console=True, on_event=events.append) as pool:
        assert check() @ pool == [True, True]
        assert pool.image.env["HF_TOKEN"] == TOKEN  # the transformed image carries it...
        shown = repr(pool.image) + repr(pool) + repr(pool.plugins)
    out, err = capfd.readouterr()
    assert "env names ['HF_TOKEN', 'HUGGING_FACE_HUB_TOKEN']" in out + err  # the capture works
    assert TOKEN not in out + err  # ...but no output, repr or event shows it
    assert TOKEN not in shown
    assert events and all(TOKEN not in repr(e) for e in events)


# -- joblib ---------------------------------------------------------------------------------------


def where(i: int) -> tuple[int, int]:
    time.sleep(0.01)
    return i, sky.instance_info().node


def fail_on_three(i: int) -> int:
    if i == 3:
        raise ValueError(f"bad item {i}")
    return i


def test_joblib_and_sklearn_transforms_add_their_packages() -> None:
    base = sky.Image(pip=["numpy"])
    assert sky.plugins.joblib().transform(base, sky.PoolInfo(nodes=2)).pip == ("numpy", "joblib")
    assert sky.plugins.sklearn().transform(base, sky.PoolInfo(nodes=2)).pip == ("numpy", "scikit-learn", "joblib")
    # sklearn reuses the joblib plugin's backend hook rather than a copy of it.
    assert sky.plugins.sklearn().around_client is sky.plugins.joblib().around_client


def test_joblib_n_jobs_counts_every_slot_of_the_pool() -> None:
    import joblib

    # The hook takes the pool it is given: anything with a ComputePool's nodes, concurrency,
    # is_open and submit (no batch is sent here).
    def pool(nodes: int, concurrency: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(nodes=nodes, concurrency=concurrency, is_open=True, submit=None)

    with sky.plugins.joblib().around_client(pool(2, 3)):
        n = joblib.effective_n_jobs
        assert [n(-1), n(None), n(-2), n(4), n(1)] == [6, 6, 5, 4, 1]
        with pytest.raises(ValueError):
            n(0)
    with sky.plugins.joblib().around_client(pool(1, 1)):
        assert joblib.effective_n_jobs(-1) == 2  # still on the pool, not here


def test_joblib_parallel_spreads_batches_over_every_node_in_order() -> None:
    import joblib
    from joblib import Parallel, delayed
    from joblib.parallel import get_active_backend

    before = type(get_active_backend()[0])
    with sky.ComputePool(nodes=2, concurrency=2, plugins=[sky.plugins.joblib()], console=False) as pool:
        assert joblib.effective_n_jobs(-1) == 4
        out = Parallel(n_jobs=-1)(delayed(where)(i) for i in range(40))
        assert [i for i, _ in out] == list(range(40))
        assert {node for _, node in out} == {0, 1}

        # A failing call raises its own type; the pool (and the backend) keep working.
        with pytest.raises(ValueError, match="bad item 3"):
            Parallel(n_jobs=-1)(delayed(fail_on_three)(i) for i in range(8))
        assert Parallel()(delayed(abs)(-i) for i in range(5)) == [0, 1, 2, 3, 4]

        # By name, too (e.g. from another thread, where parallel_config does not reach).
        assert Parallel(backend="skyward", n_jobs=2)(delayed(where)(i) for i in range(4))[3][0] == 3
        assert pool.is_open
    assert type(get_active_backend()[0]) is before  # the previous backend is back
    with pytest.raises(sky.ConfigError, match="no open pool"):
        Parallel(backend="skyward", n_jobs=2)(delayed(abs)(i) for i in range(2))


# -- sklearn --------------------------------------------------------------------------------------


def test_sklearn_grid_search_on_the_pool_matches_a_local_one() -> None:
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.model_selection import GridSearchCV
    from sklearn.tree import DecisionTreeClassifier

    X, y = make_classification(n_samples=300, n_features=10, n_informative=5, random_state=0)
    grid = {"max_depth": [1, 2, 4, 8], "min_samples_leaf": [1, 10]}

    def search(n_jobs: int) -> GridSearchCV:
        return GridSearchCV(DecisionTreeClassifier(random_state=0), grid, cv=3, n_jobs=n_jobs).fit(X, y)

    local = search(1)
    started: list[ev.TaskStarted] = []
    on_event = lambda e: started.append(e) if isinstance(e, ev.TaskStarted) else None  # noqa: E731
    with sky.ComputePool(nodes=2, plugins=[sky.plugins.sklearn()], console=False, on_event=on_event):
        remote = search(-1)
    assert remote.best_params_ == local.best_params_
    assert np.allclose(remote.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"])
    assert {e.name for e in started} == {"joblib"}
    assert {e.node for e in started} == {0, 1}
