"""A griffe extension for the API reference (mkdocs.yml): our docstrings are written to read
well in ``help()`` and in the source, with doctest examples and Sphinx-style roles; this turns
them into the Markdown that mkdocstrings renders.

- ``>>>`` examples become fenced Python blocks (doctest flags dropped);
- ``:class:`~skyward.X``` and the other roles become code: ```X```;
- a paragraph ending in ``::`` (a reStructuredText literal block) ends in ``:``, and a line
  that is only ``::`` goes.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_FLAGS = re.compile(r"\s*# doctest:.*$")


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


def markdown(text: str) -> str:
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    fenced = False
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            fenced = not fenced
        if fenced or stripped.startswith("```"):
            out.append(line)
            i += 1
            continue
        if stripped.startswith(">>>"):
            indent = line[: len(line) - len(stripped)]
            block: list[str] = []
            while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
                block.append(_FLAGS.sub("", lines[i][len(indent):]))
                i += 1
            out += [f"{indent}```python", *(indent + b for b in block), f"{indent}```"]
            continue
        line = _ROLE.sub(_role, line)
        if line.strip() == "::":  # a literal block announced on a line of its own
            i += 1
            continue
        if line.rstrip().endswith("::") and not line.rstrip().endswith(" ::"):
            line = line.rstrip()[:-1]
        out.append(line)
        i += 1
    return "\n".join(out)


class DocstringsToMarkdown(Extension):
    def on_object(self, *, obj: Any, **kwargs: Any) -> None:
        if not obj.is_alias and obj.docstring is not None:  # an alias shares its target's
            obj.docstring.value = markdown(obj.docstring.value)
