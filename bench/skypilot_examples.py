"""How many of SkyPilot's own example task files ``skyward launch --dryrun`` accepts.

Usage: ``python bench/skypilot_examples.py SKYPILOT_CHECKOUT [--as-told] [--show refused|warned|all]``

Every ``*.yaml``/``*.yml`` under the checkout's ``examples/`` and ``llm/`` that is a task file
(a mapping, or documents of mappings, with ``run``, ``setup`` or ``resources``) is planned as
``skyward launch FILE --dryrun`` plans it, from the checkout's root (recipes name their
workdir relative to it). Each ends as *accepted* (a plan), *refused* (a task-file error listing
every reason) or *crashed* (any other exception: a bug). The files are read, never copied.

``--as-told`` plans each file as its README tells a user to launch it: a variable the file
leaves empty (``HF_TOKEN:``) is given with ``--env``/``--secret``, and a file whose relative
paths are not found from the checkout's root is planned from its own folder instead.
``--with-user-files`` (implies ``--as-told``) also puts in place, as empty folders under a
scratch ``HOME`` (never the real one), the user's own files a recipe copies from ``~/``
(``~/.kaggle/kaggle.json``, ``~/.ssh/id_rsa.pub``): what its README's prerequisites ask for.

Every refusal is also sorted by whose move it is: *the user's* when every reason is input
SkyPilot refuses a file without too (a variable left empty, a local file that is not there, a
bucket name to fill in, a copy tool this machine lacks), *Skyward's* otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import sys
import tempfile
import traceback
from pathlib import Path


def task_files(root: Path) -> list[Path]:
    import yaml

    found = []
    for folder in ("examples", "llm"):
        for path in sorted((root / folder).rglob("*.y*ml")):
            try:
                docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
            except Exception:  # noqa: BLE001 - not YAML: a task file the user would still try
                found.append(path)
                continue
            if any(isinstance(d, dict) and ({"run", "setup", "resources"} & set(d)) for d in docs):
                found.append(path)
    return found


#: Words of the problems that are the user's to resolve (SkyPilot refuses these files too).
USER_INPUT = ("a value: pass --", "a local path that exists", "a local directory that exists",
              "for you to fill in", "its variables set in envs", "is not on this machine's PATH")


def users_part(problem) -> bool:  # noqa: ANN001
    return any(words in problem.line() for words in USER_INPUT)


def plan_as(path: Path, root: Path, as_told: bool, user_files: bool = False):  # noqa: ANN201
    from skyward.launch.taskfile.check import TaskFileError

    if not user_files:
        return _plan_as(path, root, as_told)
    home = os.environ.get("HOME")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["HOME"] = scratch
        try:
            while True:
                try:
                    return _plan_as(path, root, True)
                except TaskFileError as exc:
                    wanted = {Path(p.got.strip("'")).expanduser() for p in exc.problems
                              if "a local" in p.accepted and p.got.startswith("'~/")}
                    if not wanted or any(w.exists() for w in wanted):  # none, or put in place already
                        raise
                    for folder in wanted:
                        folder.mkdir(parents=True, exist_ok=True)
        finally:
            if home is not None:
                os.environ["HOME"] = home


def _plan_as(path: Path, root: Path, as_told: bool):  # noqa: ANN202
    from skyward.launch.taskfile.check import TaskFileError
    from skyward.launch import plan

    if not as_told:
        return plan(path)
    try:
        return plan(path)
    except TaskFileError as exc:
        given: dict[str, list[str]] = {"envs": [], "secrets": []}
        for problem in exc.problems:  # envs['HF_TOKEN'] left empty: given, as the README says
            field = problem.field.split(": ")[-1]
            kind, _, name = field.partition("[")
            if kind in given and problem.got == "None":
                given[kind].append(f"{name.strip(chr(93)).strip(chr(39))}=x")
        envs, secrets = given["envs"], given["secrets"]
        try:
            return plan(path, env=envs, secrets=secrets)
        except TaskFileError as from_root:
            os.chdir(path.parent)  # the README's `cd` into the recipe's folder
            try:
                return plan(path, env=envs, secrets=secrets)
            except TaskFileError as from_folder:  # report the launch that got further
                raise min(from_root, from_folder, key=lambda e: len(e.problems)) from None
            finally:
                os.chdir(root)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--show", choices=("refused", "warned", "all"), default=None)
    parser.add_argument("--as-told", action="store_true")
    parser.add_argument("--with-user-files", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from skyward.errors import ConfigError

    root = args.root.resolve()
    os.chdir(root)
    outcome: dict[str, list[tuple[Path, str]]] = collections.defaultdict(list)
    reasons: collections.Counter[str] = collections.Counter()
    users: list[Path] = []
    for path in task_files(root):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                p = plan_as(path, root, args.as_told, args.with_user_files)
            p.describe()
            outcome["accepted"].append((path, "\n".join(p.warnings)))
        except ConfigError as exc:
            outcome["refused"].append((path, str(exc)))
            problems = getattr(exc, "problems", ())
            if problems and all(users_part(problem) for problem in problems):
                users.append(path)
            for problem in getattr(exc, "problems", ()):
                reasons[problem.field.split("[")[0].split(": ")[-1] + ": " + problem.accepted[:50]] += 1
        except Exception:  # noqa: BLE001 - what is measured
            outcome["crashed"].append((path, traceback.format_exc()))
    total = sum(len(v) for v in outcome.values())
    for kind in ("accepted", "refused", "crashed"):
        print(f"{kind}: {len(outcome[kind])} of {total} ({100 * len(outcome[kind]) / max(total, 1):.1f}%)")
        if kind == "refused":
            print(f"  the user's part only (variables, own files, names to fill in, tools): {len(users)}; "
                  f"Skyward's: {len(outcome[kind]) - len(users)}")
    print("\nmost common reasons for refusal:")
    for reason, count in reasons.most_common(15):
        print(f"  {count:3d}  {reason}")
    for kind in ("crashed", *(("refused",) if args.show in ("refused", "all") else ()),
                 *(("accepted",) if args.show in ("warned", "all") else ())):
        for path, text in outcome[kind]:
            print(f"\n== {kind}: {path.relative_to(root)}\n{text}")
    return 1 if outcome["crashed"] else 0


if __name__ == "__main__":
    sys.exit(main())
