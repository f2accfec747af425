"""How a task file's ``setup`` and ``run`` blocks are wrapped before they reach the nodes.

* :func:`login_shell`: the block runs as SkyPilot runs it, in a bash that has read the user's
  ``~/.bashrc`` as an interactive one does (so ``conda activate`` and ``PATH`` edits a setup
  block wrote there hold in ``run``). The interactive shell only reads the file: its own
  messages (no terminal, no job control) go nowhere, and the block itself runs in a plain
  (non-interactive) subshell with the node's stderr, back in the directory it was started in.
* :func:`here_document`: how a block reaches the shell (or the container) that runs it: as the
  input of a here-document inside the wrapping script, never as a command-line argument, which
  Linux caps at 128 KiB (SkyPilot's long-script test sends blocks of 200,000 lines). The
  wrapping script itself reaches the node as a file (:func:`skyward.runtime.command.write_script`).
* :func:`on_first`: a run on the first ``n`` nodes of a bigger cluster (a task's ``num_nodes``
  below the cluster's): the other nodes do nothing, and ``SKYPILOT_NUM_NODES`` and
  ``SKYPILOT_NODE_IPS`` (and their ``SKYWARD_*`` twins) describe the nodes the run uses.
"""

from __future__ import annotations

import hashlib
import shlex

__all__ = ["here_document", "login_shell", "on_first"]

# $1: the directory to run in; the block comes on fd 4 (read whole, then closed for the block).
# fd 3 carries the node's stderr past the interactive shell's start (whose warnings about the
# missing terminal are dropped).
_INTERACTIVE = '(exec 2>&3 3>&-; cd -- "$1" || exit; eval "$(cat <&4)" 4<&-)'


def here_document(block: str, fd: int = 0) -> str:
    """A redirection of descriptor ``fd`` from a here-document holding ``block`` word for word,
    to end a command's line with: its delimiter is made from the block's own hash, so no line of
    the block can close it early, and the same block gives the same text."""
    mark = "SKYWARD_BLOCK_" + hashlib.sha256(block.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    body = block if block.endswith("\n") else block + "\n"
    return f"{fd if fd else ''}<<'{mark}'\n{body}{mark}"


def login_shell(block: str) -> str:
    """Shell code that runs ``block`` after bash has read ``~/.bashrc`` (see the module docstring)."""
    return (f"exec 3>&2\nexec bash -i -c {shlex.quote(_INTERACTIVE)} skyward \"$PWD\" 2>/dev/null "
            + here_document(block, 4))


def on_first(nodes: int, block: str) -> str:
    """Shell code that runs ``block`` on nodes ``0 … nodes-1`` only (see the module docstring)."""
    return (f'[ "$SKYPILOT_NODE_RANK" -lt {nodes} ] || exit 0\n'
            f"SKYPILOT_NUM_NODES={nodes}\n"
            f'SKYPILOT_NODE_IPS=$(printf "%s\\n" "$SKYPILOT_NODE_IPS" | head -n {nodes})\n'
            'export SKYPILOT_NUM_NODES SKYPILOT_NODE_IPS SKYWARD_NUM_NODES="$SKYPILOT_NUM_NODES" '
            'SKYWARD_NODE_IPS="$SKYPILOT_NODE_IPS"\n'
            f"{block}")
