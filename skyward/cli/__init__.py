"""The ``skyward`` command (``skyward = skyward.cli:main``): the top layer, which may import
every other; nothing in the package imports it.

- :mod:`~skyward.cli.main`: the parser, ``launch``/``exec``, the AWS resource commands;
- :mod:`~skyward.cli.clusters`: ``status``, ``start``, ``stop``, ``down``, ``logs`` on named
  clusters;
- :mod:`~skyward.cli.managed`: ``jobs launch``, ``jobs queue``, ``jobs logs``, ``jobs cancel``
  (managed jobs, :mod:`skyward.jobs`).

``skyward --help`` and ``status`` import no paramiko, boto3, pydantic or torch: each command
imports what it needs when it runs.
"""

from __future__ import annotations

from skyward.cli.main import main

__all__ = ["main"]
