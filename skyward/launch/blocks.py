"""How a task file's ``setup`` and ``run`` blocks are wrapped before they reach the nodes.

* :func:`login_shell`: the block runs as SkyPilot runs it, in a bash that has read the user's
  ``~/.bashrc`` as an interactive one does (so ``conda activate`` and ``PATH`` edits a setup
  block wrote there hold in ``run``). The interactive shell only reads the file: its own
  messages (no terminal, no job control) go nowhere, and the block itself runs in a plain
  (non-interactive) subshell with the node's stderr, back in the directory it was started in.
* :func:`on_first`: a run on the first ``n`` nodes of a bigger cluster (a task's ``num_nodes``
  below the cluster's): the other nodes do nothing, and ``SKYPILOT_NUM_NODES`` and
  ``SKYPILOT_NODE_IPS`` (and their ``SKYWARD_*`` twins) describe the nodes the run uses.
"""

from __future__ import annotations

import shlex

__all__ = ["login_shell", "on_first"]

# $1: the directory to run in, $2: the block. fd 3 carries the node's stderr past the
# interactive shell's start (whose warnings about the missing terminal are dropped).
_INTERACTIVE = '(exec 2>&3 3>&-; cd -- "$1" || exit; eval "$2")'


def login_shell(block: str) -> str:
    """Shell code that runs ``block`` after bash has read ``~/.bashrc`` (see the module docstring)."""
    return (f"exec 3>&2\nexec bash -i -c {shlex.quote(_INTERACTIVE)} skyward \"$PWD\" {shlex.quote(block)} "
            "2>/dev/null")


def on_first(nodes: int, block: str) -> str:
    """Shell code that runs ``block`` on nodes ``0 … nodes-1`` only (see the module docstring)."""
    return (f'[ "$SKYPILOT_NODE_RANK" -lt {nodes} ] || exit 0\n'
            f"SKYPILOT_NUM_NODES={nodes}\n"
            f'SKYPILOT_NODE_IPS=$(printf "%s\\n" "$SKYPILOT_NODE_IPS" | head -n {nodes})\n'
            'export SKYPILOT_NUM_NODES SKYPILOT_NODE_IPS SKYWARD_NUM_NODES="$SKYPILOT_NUM_NODES" '
            'SKYWARD_NODE_IPS="$SKYPILOT_NODE_IPS"\n'
            f"{block}")
