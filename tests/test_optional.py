"""Optional dependencies: one import point, and a missing extra is one clear line.

Each test runs a real interpreter in which the package is made unimportable the way a missing
install is (``sys.modules[name] = None`` makes ``import name`` raise ``ModuleNotFoundError``).

Internals on purpose: ``skyward._optional`` is the one import point for optional packages, and
its table of extras is checked against pyproject.toml and against every import in the package.
"""

from __future__ import annotations

import ast
import pathlib
import pickle
import subprocess
import sys

import pytest

from skyward._optional import EXTRAS, require
from skyward.errors import MissingDependency, SkywardError

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "skyward"


def without(packages: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``packages`` cannot be imported."""
    hide = "".join(f"sys.modules[{p!r}] = None; " for p in packages)
    return subprocess.run([sys.executable, "-c", f"import sys; {hide}\n{code}"],
                          capture_output=True, text=True, timeout=60)


def test_skyward_ls_without_boto3_prints_one_line_naming_the_extra() -> None:
    done = without(["boto3"], "from skyward.cli import main; sys.exit(main(['ls']))")
    assert done.returncode == 1
    assert done.stderr == "skyward: error: skyward ls needs boto3, which is not installed: pip install 'skyward[aws]'\n"
    assert done.stdout == ""


def test_ssh_provider_without_paramiko_names_the_ssh_extra() -> None:
    done = without(["paramiko"], "import skyward as sky\n"
                                 "try:\n    sky.SSH(hosts=['gpu1'])\n"
                                 "except ImportError as exc:\n"
                                 "    print(type(exc).__name__, isinstance(exc, sky.SkywardError), exc)\n")
    assert done.stdout == ("MissingDependency True sky.SSH needs paramiko, which is not installed: "
                           "pip install 'skyward[ssh]'\n"), done.stderr


def test_aws_without_boto3_names_the_aws_extra() -> None:
    done = without(["boto3", "botocore"], "from skyward.providers.aws.ec2 import EC2\n"
                                          "try:\n    EC2.connect('us-east-1')\n"
                                          "except ImportError as exc:\n    print(exc)\n")
    assert done.stdout == "sky.AWS needs boto3, which is not installed: pip install 'skyward[aws]'\n", done.stderr


def test_import_skyward_works_without_any_extra() -> None:
    done = without(["paramiko", "boto3", "botocore", "torch", "numpy"],
                   "import skyward as sky, skyward.providers, skyward.plugins\n"
                   "print(sky.compute(lambda: 1).local())")
    assert (done.returncode, done.stdout) == (0, "1\n"), done.stderr


def test_require_returns_the_module_when_installed() -> None:
    import json

    assert require("json", "a test") is json  # any importable module comes back as is


def test_missing_dependency_is_an_import_error_and_a_skyward_error_and_pickles() -> None:
    err = MissingDependency("paramiko", "sky.SSH", "ssh")
    assert isinstance(err, ImportError) and isinstance(err, SkywardError) and err.name == "paramiko"
    clone = pickle.loads(pickle.dumps(err))
    assert (clone.package, clone.feature, clone.extra, str(clone)) == ("paramiko", "sky.SSH", "ssh", str(err))


def test_a_package_that_belongs_to_no_extra_is_not_explained_away() -> None:
    with pytest.raises(ModuleNotFoundError) as caught:
        require("surely_not_installed_anywhere", "a test")
    assert not isinstance(caught.value, MissingDependency)


# Packages only an extra installs, on the client side. (torch, jax and friends are the
# worker's business: plugins import them inside their hooks, with their own messages.)
CLIENT_EXTRAS = ("paramiko", "boto3", "botocore", "cryptography", "joblib")


def test_client_extras_are_imported_only_through_require() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                if name.partition(".")[0] in CLIENT_EXTRAS:
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    assert offenders == []
    assert all(p in EXTRAS for p in CLIENT_EXTRAS)


def test_paramiko_comes_without_invoke_until_an_ssh_config_match_exec_needs_it() -> None:
    # paramiko's config parser imports invoke (0.05-0.075 s of CPU in a fresh interpreter) for
    # `Match exec` alone: skyward's SSH path loads it when such a line is evaluated, not before.
    code = ("from skyward._optional import require\n"
            "paramiko = require('paramiko', 'sky.SSH')\n"
            "print(sorted(m for m in sys.modules if m.startswith('invoke.')))\n"
            "config = paramiko.SSHConfig.from_text('Match exec \"exit 0\"\\n  User matched\\n')\n"
            "print(config.lookup('somehost').get('user'))\n")
    done = without([], code)
    assert done.stdout.splitlines() == ["[]", "matched"], done.stderr
