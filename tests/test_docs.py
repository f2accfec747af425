"""The documentation covers what it must: every public name in the API reference, every guide
on a page of its own that includes the script, every page in the navigation.

(``scripts/test.sh`` builds the site with ``mkdocs build --strict`` before the suite runs.)
"""

from __future__ import annotations

import pathlib
import re

import skyward as sky
import skyward.plugins
import skyward.providers

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS = (ROOT / "mkdocs.yml").read_text()


def documented_objects() -> set[str]:
    """The last component of every ``::: path`` directive in the reference pages."""
    names = set()
    for page in (DOCS / "reference").glob("*.md"):
        names.update(m.rpartition(".")[2] for m in re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    return names


def test_every_public_name_is_in_the_api_reference() -> None:
    documented = documented_objects()
    modules = documented & {"errors", "events"}  # a module directive documents all its members
    assert modules == {"errors", "events"}
    errors = {n for n in sky.__all__ if n.endswith("Error") or n in ("ConnectionLost", "WorkerLost",
                                                                       "TaskCancelled", "TaskTimeout", "CommandFailed",
                                                                       "ClusterBusy", "JobFailed", "JobTimeout", "SlurmTimeLimit")}
    wanted = {n for n in sky.__all__ if n not in ("__version__", "plugins", "integrations")} - errors
    wanted |= {n for n in skyward.plugins.__all__} | set(skyward.providers.__all__)
    wanted.add("torch")  # sky.integrations.torch
    assert sorted(wanted - documented) == []


def test_every_guide_has_a_page_that_includes_its_script() -> None:
    for script in sorted((ROOT / "guides").glob("*.py")):
        page = DOCS / "guides" / f"{script.stem}.md"
        assert page.is_file(), f"no page for guides/{script.name}"
        assert f'--8<-- "guides/{script.name}"' in page.read_text()
        assert f"guides/{script.stem}.md" in MKDOCS, f"guides/{script.stem}.md is not in the nav"


def test_every_page_is_in_the_navigation() -> None:
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert [p for p in pages if p not in MKDOCS] == []


def test_navigation_has_the_six_sections() -> None:
    import yaml  # mkdocs' own dependency

    nav = yaml.safe_load(MKDOCS)["nav"]
    assert [next(iter(entry)) for entry in nav] == ["Get started", "Guides", "Concepts", "Providers", "Reference",
                                                     "Benchmarks"]


# -- the `skyward` command's page is true to the command ------------------------------------------
CLI_PAGE = DOCS / "cli.md"


def test_the_command_page_names_every_subcommand_and_option() -> None:
    from skyward.cli.main import build_parser

    page = CLI_PAGE.read_text()
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.choices and a.dest == "command"]
    missing = []
    for name, sub in sorted(commands.choices.items()):  # type: ignore[union-attr]
        if f"skyward {name}" not in page and f"`{name}`" not in page:
            missing.append(name)
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and not re.search(rf"{re.escape(flag)}(?![\w-])", page):
                    missing.append(f"{name} {flag}")
    assert missing == []


def test_the_command_pages_task_file_error_is_what_the_command_prints(tmp_path: pathlib.Path) -> None:
    """The bad task file the page shows, run as the page runs it, prints the page's error."""
    import os
    import subprocess
    import sys

    page = CLI_PAGE.read_text()
    task = re.search(r"```yaml\n# bad\.yaml\n(.*?)```", page, re.S)
    shown = re.search(r"```text\n\$ skyward launch bad\.yaml --dryrun\n(.*?)```", page, re.S)
    assert task and shown, "docs/cli.md shows no bad.yaml and its error"
    (tmp_path / "bad.yaml").write_text(task.group(1))
    done = subprocess.run([sys.executable, "-m", "skyward.cli", "launch", "bad.yaml", "--dryrun"], cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == shown.group(1)


# -- the pages speak to users, not of how they were written ----------------------------------------
WORK_LOG = re.compile(r"\b(this work|this session|this round|before this (?:work|change)|this change|this PR"
                      r"|issue #?\d+|was available to this)\b", re.I)


def reader_pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "examples").rglob("*.md"),
            *(ROOT / "guides").glob("*.py")]


def test_no_page_speaks_of_the_work_that_wrote_it() -> None:
    found = [f"{p.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for p in reader_pages() for text in [p.read_text()] for m in WORK_LOG.finditer(text)]
    assert found == []


def test_skytorch_is_introduced_where_it_is_named() -> None:
    """A page that names SkyTorch says what it is, or links to the page that does."""
    intro = "SkyTorch, a separate project"
    assert intro in (DOCS / "remote-device.md").read_text()
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        if "SkyTorch" in text and intro not in text:
            first = text.index("SkyTorch")
            assert "a separate project" in text[first:first + 200] and "remote-device.md" in text[first:first + 300], \
                page.name


def test_the_home_page_links_every_concept_a_newcomer_looks_for() -> None:
    home = (DOCS / "index.md").read_text()
    for page in ("start.md", "compute.md", "pool.md", "clusters.md", "elastic.md", "task-files.md", "cli.md",
                 "remote-device.md"):
        assert f"]({page})" in home, page


def table_rows(page: str) -> set[str]:
    """The first cells of the page's tables: ``| `name` | ...`` rows."""
    return set(re.findall(r"^\| `(\w+)` \|", (DOCS / page).read_text(), re.M))


def test_every_pool_parameter_and_compute_option_has_a_row() -> None:
    import inspect

    pool = [p for p in inspect.signature(sky.ComputePool.__init__).parameters if p != "self"]
    options = list(inspect.signature(sky.compute).parameters)[1:]  # (fn is the function itself)
    assert [p for p in pool if p not in table_rows("pool.md")] == []
    assert [o for o in options if o not in table_rows("compute.md")] == []
