"""Image: an immutable, validated description of a node's environment."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import skyward.image
from skyward.errors import ConfigError
from skyward.image import Image

CLIENT_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


# -- values ------------------------------------------------------------------------------------


def test_defaults_describe_an_empty_environment_on_the_clients_python():
    image = Image()
    assert image.python == "auto"
    assert image.resolved_python == CLIENT_PYTHON
    assert (image.pip, image.pip_indexes, image.apt, image.setup, image.include) == ((),) * 5
    assert dict(image.env) == {}


def test_explicit_python_is_used_as_given():
    assert Image(python="3.12").resolved_python == "3.12"


def test_lists_are_stored_as_tuples():
    image = Image(pip=["numpy"], pip_indexes=["https://example.org/simple"], apt=["ffmpeg"], setup=["true"])
    assert image.pip == ("numpy",)
    assert image.pip_indexes == ("https://example.org/simple",)
    assert image.apt == ("ffmpeg",)
    assert image.setup == ("true",)


def test_env_reads_like_a_dict_but_cannot_be_changed():
    image = Image(env={"B": "2", "A": "1"})
    assert image.env["A"] == "1"
    assert image.env.get("missing") is None
    assert dict(image.env) == {"A": "1", "B": "2"}
    assert image.env == {"A": "1", "B": "2"}
    with pytest.raises(TypeError):
        image.env["A"] = "3"  # type: ignore[index]


def test_env_changes_in_the_callers_dict_do_not_reach_the_image():
    values = {"A": "1"}
    image = Image(env=values)
    values["A"] = "changed"
    assert image.env["A"] == "1"


def test_image_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Image().python = "3.12"  # type: ignore[misc]


def test_equal_images_are_equal_and_hash_alike():
    a = Image(pip=["numpy"], env={"A": "1", "B": "2"})
    b = Image(pip=("numpy",), env={"B": "2", "A": "1"})
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1


def test_image_survives_pickling():
    image = Image(pip=["numpy"], env={"HF_TOKEN": "t"}, setup=["true"])
    assert pickle.loads(pickle.dumps(image)) == image


def test_duplicates_given_at_construction_are_dropped_keeping_the_first():
    assert Image(pip=["b", "a", "b", "a", "c"]).pip == ("b", "a", "c")


# -- changing ----------------------------------------------------------------------------------


def test_with_pip_returns_a_new_image_and_keeps_earlier_packages_in_order():
    base = Image(pip=["numpy"])
    more = base.with_pip("pandas", "numpy", "scipy")
    assert base.pip == ("numpy",)
    assert more.pip == ("numpy", "pandas", "scipy")


def test_with_pip_index_appends_an_index_once():
    url = "https://download.pytorch.org/whl/cpu"
    image = Image().with_pip("torch", index=url).with_pip("torchvision", index=url)
    assert image.pip == ("torch", "torchvision")
    assert image.pip_indexes == (url,)


def test_with_apt_appends_without_duplicates():
    base = Image(apt=["git"])
    assert base.with_apt("ffmpeg", "git").apt == ("git", "ffmpeg")
    assert base.apt == ("git",)


def test_with_setup_appends_commands_in_order():
    base = Image(setup=["echo one"])
    assert base.with_setup("echo two", "echo three").setup == ("echo one", "echo two", "echo three")


def test_with_env_adds_variables_and_a_repeated_name_takes_the_new_value():
    base = Image(env={"A": "1", "B": "2"})
    changed = base.with_env(B="3", C="4")
    assert dict(changed.env) == {"A": "1", "B": "3", "C": "4"}
    assert dict(base.env) == {"A": "1", "B": "2"}


def test_with_env_accepts_a_mapping_for_names_that_are_not_python_keywords():
    assert Image().with_env({"class": "x"}).env["class"] == "x"


def test_with_include_appends_existing_paths(tmp_path):
    (tmp_path / "a.py").write_text("a")
    (tmp_path / "b").mkdir()
    image = Image().with_include(tmp_path / "a.py").with_include(str(tmp_path / "b"), tmp_path / "a.py")
    assert image.include == (str((tmp_path / "a.py").resolve()), str((tmp_path / "b").resolve()))


def test_replace_returns_a_validated_copy():
    base = Image(pip=["numpy"])
    assert base.replace(python="3.12") == Image(python="3.12", pip=["numpy"])
    with pytest.raises(ConfigError) as err:
        base.replace(python="two")
    assert err.value.parameter == "python"


def test_replace_rejects_unknown_fields():
    with pytest.raises(ConfigError) as err:
        Image().replace(packages=["numpy"])
    assert err.value.parameter == "replace"
    assert "pip" in err.value.accepted


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"python": "3"}, "python"),
        ({"python": "python3.11"}, "python"),
        ({"python": 3.11}, "python"),
        ({"python": "2.7"}, "python"),
        ({"pip": "numpy"}, "pip"),
        ({"pip": [""]}, "pip"),
        ({"pip": ["   "]}, "pip"),
        ({"pip": [3]}, "pip"),
        ({"pip": ["--pre"]}, "pip"),
        ({"pip_indexes": ["ftp://example.org/simple"]}, "pip_indexes"),
        ({"pip_indexes": ["example.org/simple"]}, "pip_indexes"),
        ({"pip_indexes": ["https:///simple"]}, "pip_indexes"),
        ({"apt": ["Not A Package"]}, "apt"),
        ({"apt": ["ffmpeg; rm -rf /"]}, "apt"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"env": {"WITH-DASH": "x"}}, "env"),
        ({"env": {"NUM": 1}}, "env"),
        ({"env": [("A", "1")]}, "env"),
        ({"setup": [""]}, "setup"),
        ({"setup": "echo hi"}, "setup"),
        ({"include": ["/definitely/not/here/skyward"]}, "include"),
        ({"include": "/tmp"}, "include"),
    ],
)
def test_invalid_input_raises_config_error_naming_the_parameter(kwargs, parameter):
    with pytest.raises(ConfigError) as err:
        Image(**kwargs)
    assert err.value.parameter.partition("[")[0] == parameter  # a list item is named: pip[0]
    assert parameter in str(err.value)


@pytest.mark.parametrize("python", ["auto", "3.11", "3.12", "3.13.1"])
def test_valid_python_versions_are_accepted(python):
    assert Image(python=python).python == python


@pytest.mark.parametrize("url", ["https://example.org/simple", "http://10.0.0.1:8080/simple", "file:///srv/simple"])
def test_valid_index_urls_are_accepted(url):
    assert Image(pip_indexes=[url]).pip_indexes == (url,)


def test_apt_accepts_arch_and_version_qualifiers():
    assert Image(apt=["libgl1:amd64", "ffmpeg=7:5.1.6-0+deb12u1", "g++"]).apt[2] == "g++"


def test_with_methods_validate_what_they_add():
    with pytest.raises(ConfigError) as err:
        Image().with_env(**{"A": 1})  # type: ignore[arg-type]
    assert err.value.parameter == "env"
    with pytest.raises(ConfigError) as err:
        Image().with_pip("numpy", index="not a url")
    assert err.value.parameter == "pip_indexes[0]"


def test_an_invalid_secret_value_is_not_shown_in_the_error():
    with pytest.raises(ConfigError) as err:
        Image(env={"API_KEY": 123456789})  # type: ignore[dict-item]
    assert "123456789" not in str(err.value)


# -- content hash --------------------------------------------------------------------------------


def test_content_hash_is_sixteen_hex_digits_and_repeatable():
    image = Image(pip=["numpy"])
    digest = image.content_hash()
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert Image(pip=["numpy"]).content_hash() == digest


def test_content_hash_is_the_same_in_another_process():
    image = Image(pip=["numpy", "pandas"], env={"A": "1", "HF_TOKEN": "x"}, setup=["true"], apt=["git"])
    code = (
        "from skyward.image import Image;"
        "print(Image(pip=['numpy', 'pandas'], env={'HF_TOKEN': 'x', 'A': '1'}, setup=['true'], apt=['git'])"
        ".content_hash())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin", "PYTHONPATH": _repo_root()})
    assert out.stdout.strip() == image.content_hash()


def _repo_root() -> str:
    return str(Path(skyward.image.__file__).resolve().parent.parent)


BASE = Image(python="3.11", pip=["numpy"], pip_indexes=["https://example.org/simple"], apt=["git"],
             env={"A": "1"}, setup=["echo one"])


@pytest.mark.parametrize(
    "changed",
    [
        BASE.replace(python="3.12"),
        BASE.with_pip("pandas"),
        BASE.replace(pip=["numpy==2.0"]),
        BASE.replace(pip=[]),
        BASE.with_pip(index="https://other.example.org/simple"),
        BASE.with_apt("ffmpeg"),
        BASE.with_env(A="2"),
        BASE.with_env(B="1"),
        BASE.replace(env={}),
        BASE.with_setup("echo two"),
        BASE.replace(setup=["echo two", "echo one"]),
    ],
)
def test_any_change_to_the_environment_changes_the_content_hash(changed):
    assert changed.content_hash() != BASE.content_hash()


def test_auto_python_hashes_like_the_clients_version_spelled_out():
    assert Image(python="auto").content_hash() == Image(python=CLIENT_PYTHON).content_hash()


def test_include_does_not_change_the_content_hash(tmp_path):
    assert BASE.with_include(tmp_path).content_hash() == BASE.content_hash()


# -- include hash ------------------------------------------------------------------------------


def _project(tmp_path):
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "data.txt").write_text("data")
    return root


def test_include_hash_is_stable_and_independent_of_where_the_files_live(tmp_path):
    first = _project(tmp_path / "one")
    second = tmp_path / "two" / "proj"
    shutil.copytree(first, second)
    assert Image(include=[first]).include_hash() == Image(include=[second]).include_hash()


def test_include_hash_changes_when_a_file_changes(tmp_path):
    root = _project(tmp_path)
    image = Image(include=[root])
    before = image.include_hash()
    (root / "pkg" / "mod.py").write_text("x = 2\n")
    assert image.include_hash() != before


def test_include_hash_changes_when_a_file_is_renamed(tmp_path):
    root = _project(tmp_path)
    image = Image(include=[root])
    before = image.include_hash()
    (root / "data.txt").rename(root / "other.txt")
    assert image.include_hash() != before


def test_include_hash_ignores_bytecode_caches(tmp_path):
    root = _project(tmp_path)
    image = Image(include=[root])
    before = image.include_hash()
    (root / "pkg" / "__pycache__").mkdir()
    (root / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\x00")
    (root / "stale.pyc").write_bytes(b"\x00")
    assert image.include_hash() == before


def test_include_hash_covers_single_files(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("a")
    image = Image(include=[path])
    before = image.include_hash()
    path.write_text("b")
    assert image.include_hash() != before


def test_include_hash_raises_when_an_included_path_was_removed(tmp_path):
    root = _project(tmp_path)
    image = Image(include=[root])
    shutil.rmtree(root)
    with pytest.raises(ConfigError) as err:
        image.include_hash()
    assert err.value.parameter == "include"


# -- secrets in repr ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "api_key", "DB_PASSWORD", "WANDB_API_KEY"])
def test_repr_masks_values_of_secret_looking_variables(name):
    image = Image(env={name: "hunter2-value", "PLAIN": "visible"})
    text = repr(image)
    assert "hunter2-value" not in text
    assert name in text
    assert "visible" in text
    assert "hunter2-value" not in repr(image.env)
    assert "hunter2-value" not in str(image)


def test_repr_masks_credentials_inside_urls():
    image = Image(pip=["git+https://ghp_abc123@github.com/org/repo"],
                  pip_indexes=["https://user:s3cret@pypi.example.org/simple"])
    text = repr(image)
    assert "ghp_abc123" not in text and "s3cret" not in text
    assert "github.com/org/repo" in text and "pypi.example.org/simple" in text


def test_repr_shows_only_fields_that_are_set():
    assert repr(Image(pip=["numpy"])) == "Image(python='auto', pip=('numpy',))"


def test_an_env_value_with_a_nul_character_is_refused():
    with pytest.raises(ConfigError) as err:
        Image(env={"MODE": "a\0b"})
    assert err.value.parameter == "env"
    assert "NUL" in err.value.accepted and err.value.detail == "for MODE"


def test_a_bad_list_item_is_named_by_its_index():
    with pytest.raises(ConfigError) as err:
        Image(pip=["numpy", "--pre"])
    assert err.value.parameter == "pip[1]"
    assert err.value.got == "--pre"
