"""The code on the pages runs and shows what the page says it does.

Convention: a fenced ``python`` block in README.md or docs/*.md that a reader can paste and run
as it is (on the Local provider, in seconds) comes right after an HTML comment naming what it
prints, one quoted string or more (each must appear in its standard output)::

    <!-- run: expect "9" "[9, 9, 9, 9]" -->
    ```python
    ...
    ```

(Markdown shows nothing of the comment.) Each marked block runs in its own interpreter, from a
fresh temporary directory, with this checkout's skyward, the console in plain mode and a time
limit; it must exit 0, print no traceback, and print every expected string. Blocks without
the comment are excerpts (they need a cloud, a GPU or names defined elsewhere) and are not run.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LIMIT = 120  # seconds per snippet on a busy 2-core machine; they take a few seconds alone

_MARK = re.compile(r"^<!-- run: (?P<expect>.*?) -->\n```python\n(?P<code>.*?)^```", re.M | re.S)
_EXPECT = re.compile(r'^(?:expect(?: "(?:[^"\\]|\\.)*")+)$')


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    code: str
    expect: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def snippets() -> list[Snippet]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in _MARK.finditer(text):
            assert _EXPECT.match(m["expect"]), f"{page.name}: a run comment is expect \"...\" ..., not {m['expect']!r}"
            expect = tuple(s.encode().decode("unicode_escape") for s in re.findall(r'"((?:[^"\\]|\\.)*)"', m["expect"]))
            found.append(Snippet(str(page.relative_to(ROOT)), text.count("\n", 0, m.start()) + 2, m["code"], expect))
    return found


SNIPPETS = snippets()


def test_every_run_comment_is_followed_by_a_python_block() -> None:
    for page in PAGES:
        text = page.read_text()
        marks = len(re.findall(r"^<!-- run:", text, re.M))
        assert marks == len(_MARK.findall(text)), f"{page.name}: a run comment not right before a ```python block"


def test_the_pages_that_promise_output_have_their_snippets_marked() -> None:
    pages = {s.page for s in SNIPPETS}
    assert {"README.md", "docs/elastic.md", "docs/start.md"} <= pages, sorted(pages)
    # the README's quick start and the elastic page's first example are the ones readers run first
    assert any("square(3) @ pool" in s.code for s in SNIPPETS if s.page == "README.md")
    assert any("nodes=(1," in s.code for s in SNIPPETS if s.page == "docs/elastic.md")


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("snippet", SNIPPETS, ids=str)
def test_snippet_runs_and_shows_what_its_page_says(snippet: Snippet, tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "SKYWARD_CONSOLE": "plain", "PYTHONPATH": str(ROOT), "SKYWARD_HOME": str(tmp_path / "home")}
    (tmp_path / "snippet.py").write_text(snippet.code)
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=LIMIT)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Traceback" not in output, output[-4000:]
    missing = [e for e in snippet.expect if e not in done.stdout]
    assert missing == [], f"{snippet}: not printed: {missing}\n{done.stdout[-4000:]}"
