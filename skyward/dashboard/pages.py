"""The dashboard's HTML: one page per question (which clusters are up and what they cost, what a
cluster's nodes are doing, which jobs run, what a job prints). The server writes each page's
frame; ``static/dashboard.js`` fills its tables from the JSON API and keeps them current
(every value set with ``textContent``: nothing the API returns is ever read as HTML). Every
value put in a page here goes through :func:`html.escape`.
"""

from __future__ import annotations

from html import escape

__all__ = ["cluster_page", "clusters_page", "job_page", "jobs_page", "managed_page"]

_FRAME = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">
<meta name="skyward-token" content="{token}">
<title>{title} · skyward</title><link rel="stylesheet" href="/static/style.css"></head>
<body data-page="{page}"{data}>
<header><a class="brand" href="/">skyward</a><nav><a href="/"{on_clusters}>Clusters</a>
<a href="/jobs"{on_jobs}>Jobs</a></nav><span id="updated" class="muted"></span></header>
<main><h1>{heading}</h1><p id="message" role="status"></p>
{body}</main><script src="/static/dashboard.js"></script></body></html>
"""


def _frame(page: str, title: str, heading: str, body: str, token: str, **data: str | int) -> str:
    return _FRAME.format(
        token=escape(token), title=escape(title), page=page, heading=heading, body=body,
        data="".join(f' data-{k}="{escape(str(v))}"' for k, v in data.items()),
        on_clusters=' class="on"' if page.startswith("cluster") else "",
        on_jobs=' class="on"' if page.startswith(("job", "managed")) else "")


def _table(table_id: str, columns: tuple[str, ...], empty: str) -> str:
    heads = "".join(f"<th>{c}</th>" for c in columns)
    return (f'<table id="{table_id}"><thead><tr>{heads}</tr></thead><tbody></tbody></table>'
            f'<p class="empty muted" data-for="{table_id}">{empty}</p>')


def clusters_page(token: str) -> str:
    body = _table("clusters", ("Name", "Provider", "Nodes", "Status", "Autostop", "$/h", "Cost so far", ""),
                  "No clusters. <code>skyward launch -c NAME</code> makes one.")
    body += '<p class="muted" id="total"></p>'
    body += ("<h2>Pools of running scripts</h2>"
             + _table("pools", ("Script", "PID", "Pool", "Provider", "Nodes", "Tasks", "Tasks/s", "Started"),
                      "No pool shows here now. A script's pool does with <code>ComputePool(..., dashboard=True)</code>"
                      " or <code>SKYWARD_DASHBOARD=1</code>."))
    return _frame("clusters", "Clusters", "Clusters", body, token)


def cluster_page(token: str, name: str) -> str:
    body = ('<p id="summary" class="summary"></p><div class="actions" id="actions"></div>'
            "<h2>Nodes</h2>" + _table("nodes", ("Node", "Host", "State", "CPU", "CPU, last minutes", "Memory", "GPU"),
                                      "No nodes answer now.")
            + "<h2>Job queue</h2>" + _table("jobs", ("ID", "Name", "Submitted", "Duration", "Resources", "Cost",
                                                     "Status"), "No jobs yet.")
            + '<h2>Events</h2><ol id="events" class="timeline"></ol>'
              '<p class="empty muted" data-for="events">Nothing recorded yet.</p>')
    return _frame("cluster", name, f'Cluster <span class="name">{escape(name)}</span>', body, token, cluster=name)


def jobs_page(token: str) -> str:
    body = ("<h2>Managed jobs</h2>"
            + _table("managed", ("ID", "Name", "Submitted", "Duration", "Job duration", "#Recoveries", "Resources",
                                 "Cost", "Status", ""), "No managed jobs. <code>skyward jobs launch TASK.yaml</code> runs one.")
            + "<h2>Cluster jobs</h2>"
            + _table("jobs", ("Cluster", "ID", "Name", "Submitted", "Duration", "Resources", "Cost", "Status"),
                     "No jobs on any cluster."))
    return _frame("jobs", "Jobs", "Jobs", body, token)


_LOG = ('<p id="summary" class="summary"></p><div class="actions"><button id="cancel" class="danger" hidden>'
        'Cancel job</button><label class="follow"><input type="checkbox" id="follow" checked> follow</label>'
        '<input id="filter" type="search" placeholder="filter lines"></div>'
        '<pre id="log" class="log" aria-live="polite"></pre>')


def managed_page(token: str, job_id: int) -> str:
    return _frame("managed", f"managed job {job_id}", f"Managed job {job_id}", _LOG, token, job=job_id)


def job_page(token: str, name: str, job_id: int) -> str:
    heading = f'Job {job_id} on <a href="/clusters/{escape(name)}">{escape(name)}</a>'
    return _frame("job", f"job {job_id} on {name}", heading, _LOG, token, cluster=name, job=job_id)
