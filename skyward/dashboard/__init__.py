"""``skyward dashboard``: clusters, their nodes, jobs and logs in a browser, on this machine.

A small web server (Starlette on uvicorn, the ``skyward[dashboard]`` extra) on 127.0.0.1, behind
a per-start token (:mod:`.guard`); its pages (:mod:`.pages`, ``static/``) poll a JSON API whose
answers come from the functions the ``skyward`` command uses (:mod:`.views`). The core install
never imports the server's packages: they are imported when the command runs.
"""

from skyward.dashboard.app import DEFAULT_PORT, serve

__all__ = ["DEFAULT_PORT", "serve"]
