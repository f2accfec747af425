"""``python -m skyward.cli``: the ``skyward`` command."""

from skyward.cli import run

run()
