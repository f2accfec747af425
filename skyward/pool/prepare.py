"""Host preparation: the pool readies every machine the same way, through any Transport.

For an instance whose ``environment`` is None (the Local provider) the workers run in the
client's own interpreter and nothing is prepared. Otherwise, on the machine the instance
describes, under ``environment.root`` (default ``~/.skyward``)::

    wheels/<sha>/skyward-<version>-py3-none-any.whl   the client's skyward, by content
    bootstrap/<tag>.sh                                the bootstrap script (mode 0600; it
                                                      deletes itself when it starts)
    run/<tag>.env                                     the image's env for this pool's workers
                                                      (mode 0600; the worker deletes it once
                                                      read, the pool writes it again before
                                                      starting another)
    envs/<env>/                                       the venv for an image (+ .ready marker)
    include/<include_hash>/                           the image's include files
    uv-pkg/                                           uv, when the machine had none

Steps: connect (retried while the machine boots, ``reach_timeout``), upload the client's
skyward as a wheel (skipped when the same wheel is there), sync the image's include files,
run the bootstrap script of :mod:`skyward.bootstrap` (skipped when the environment for the
image's content hash is ready), and say how to start the worker. Every failure raises
:class:`~skyward.errors.BootstrapError` naming the host, the step and the last lines of output.

The image's secrets (:meth:`~skyward.Image.secrets`) are masked in every line logged and in
errors; on the host they live only in the two private files above, each only until it is read.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import shlex
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skyward._retry import Backoff, retry
from skyward._secrets import Redactor
from skyward.errors import BootstrapError
from skyward.providers.base import HostEnvironment, Instance
from skyward.transport.base import Transport, WorkerLaunch

_LOG_TAIL = 40


def prepare(instance: Instance, transport: Transport, image: Any, log: Callable[[str], None]) -> WorkerLaunch:
    """Make ``instance`` ready for ``image`` and say how to start its worker."""
    if instance.environment is None:
        return client_launch()
    return _Preparation(instance.environment, instance, transport, image, log).run()


def client_launch() -> WorkerLaunch:
    """A worker in the client's interpreter, with the client's import path, so that functions
    pickled by reference (defined in the user's modules) import on the worker too."""
    paths = [os.getcwd()] + [p for p in sys.path if p and os.path.isdir(p)]
    env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
    return WorkerLaunch((sys.executable, "-m", "skyward.worker"), env, os.getcwd(), python=sys.executable,
                        forkable=True)


class _Preparation:
    """Preparing one machine: every step, with its log tail."""

    def __init__(self, env: HostEnvironment, instance: Instance, transport: Transport, image: Any,
                 log: Callable[[str], None]):
        self.env = env
        self.instance = instance
        self.transport = transport
        self.image = image
        self.log = log
        self.tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL)
        self.step = "connect"
        self.redact = Redactor(self._secrets())

    def _secrets(self) -> list[str]:
        from skyward._secrets import looks_secret

        found = list(self.image.secrets())
        found += [v for k, v in self.env.env.items() if looks_secret(k)]
        return found

    def note(self, line: str) -> None:
        line = self.redact(line)
        self.tail.append(line)
        self.log(line)

    def fail(self, message: str, exit_code: int | None = None) -> BootstrapError:
        return BootstrapError(self.transport.host, self.step, self.redact(message), exit_code=exit_code,
                              log_tail=list(self.tail), node=self.instance.node)

    def run(self) -> WorkerLaunch:
        try:
            return self._run()
        except BootstrapError:
            raise
        except (OSError, EOFError, TimeoutError) as exc:
            raise self.fail(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("paramiko"):  # translated at this boundary too
                raise self.fail(f"SSH error: {exc}") from exc
            raise

    def _run(self) -> WorkerLaunch:
        from skyward import _ship
        from skyward.bootstrap import env_file_text, render, worker_command

        t = self.transport
        p = self.env
        if p.note:
            self.note(p.note)
        self.note(f"connecting to {t.host}")
        started = time.monotonic()
        self._connect()
        self.note(f"connected in {time.monotonic() - started:.2f}s")

        self.step = "upload"
        root = t.expand(p.root)
        wheel = _ship.skyward_wheel()
        wheel_dir = f"{root}/wheels/{wheel.sha256[:16]}"
        remote_wheel = f"{wheel_dir}/{wheel.name}"
        have = t.exists(remote_wheel, size=wheel.path.stat().st_size)
        # A host prepared before has the folders: asked by file (no process on the host), the
        # shell command that makes them runs only where one is missing.
        if not (have and t.exists(f"{root}/bootstrap") and t.exists(f"{root}/run")):
            self._sh(f"umask 077 && mkdir -p {shlex.quote(wheel_dir)} {shlex.quote(root + '/bootstrap')} "
                     f"{shlex.quote(root + '/run')}")
        if have:
            self.note(f"skyward wheel {wheel.sha256[:16]} already on the host")
        else:
            t.put(str(wheel.path), remote_wheel, mode=0o644)
            self.note(f"uploaded skyward wheel {wheel.sha256[:16]}")

        pythonpath: list[str] = []
        if self.image.include:
            self.step = "include"
            pythonpath.append(self._sync_include(root))

        self.step = "bootstrap"
        image = self.image
        missing = {k: v for k, v in p.env.items() if k not in image.env}
        if missing:
            image = image.with_env(**missing)
        # The script and the env file hold the image's env (secrets, maybe): private files, never a
        # command line. Each preparation has its own, so that closing one pool removes only its own.
        tag = uuid.uuid4().hex[:12]
        env_file = f"{root}/run/{tag}.env"
        path = f"{root}/bootstrap/{tag}.sh"
        script = render(image, root=root, skyward_wheel=remote_wheel, find_links=p.find_links,
                        no_index=p.no_index, system_site_packages=p.system_site_packages,
                        env_file=env_file, script_path=path, wheel_sha=wheel.sha256[:16])
        t.put_bytes(script.text.encode(), path, mode=0o600)
        try:
            self._bootstrap(path)
        except BaseException:
            self._remove(path, env_file)
            raise
        # The worker reads the env file and deletes it; a later worker gets it written again
        # (WorkerLaunch.files), so no copy of the secrets stays on the host while the pool
        # runs, nor after a client killed outright.
        command = worker_command(script, root=root, pythonpath=pythonpath, consume_env=True)
        return WorkerLaunch(("bash", "-c", command), {}, None, cleanup=(env_file,),
                            files=((env_file, env_file_text(image)),), python=script.python)

    def _remove(self, *paths: str) -> None:
        """Best effort: delete files that hold secrets (the host may be gone)."""
        with contextlib.suppress(Exception):
            self.transport.run("rm -f -- " + " ".join(shlex.quote(p) for p in paths), timeout=30.0)

    def _connect(self) -> None:
        """Connect, retrying for ``reach_timeout`` seconds while the machine boots; an error
        marked permanent (a host key that does not match) is not retried."""

        def waiting(attempt: int, exc: BaseException, pause: float) -> None:
            if attempt == 1:
                self.note(f"waiting for sshd on {self.transport.host}")

        retry(lambda: self.transport.connect(node=self.instance.node),
              Backoff(timeout=self.env.reach_timeout, delay=1.0, factor=1.5, max_delay=5.0),
              on=BootstrapError, giveup=lambda exc: isinstance(exc, BootstrapError) and exc.permanent, on_retry=waiting)

    def _sh(self, command: str, stdin: bytes | None = None) -> None:
        result = self.transport.run(command, timeout=60.0, stdin=stdin)
        if not result.ok:
            for line in (result.stdout + result.stderr).splitlines()[-10:]:
                self.note(line)
            raise self.fail(f"`{command[:80]}` failed", result.exit_code)

    def _sync_include(self, root: str) -> str:
        from skyward.image import _included_files

        digest = self.image.include_hash()
        final = f"{root}/include/{digest}"
        if self.transport.exists(final + "/.complete"):
            self.note(f"include files {digest} already on the host")
            return final
        # One archive over SFTP, unpacked beside the target and renamed into place, so a
        # half-copied tree is never used (and two pools racing end up with one copy).
        import tarfile  # (here: a pool that attaches to a cluster, `exec`, packs nothing)

        buffer = io.BytesIO()
        count = 0
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for include in self.image.include:
                for rel, path in _included_files(Path(include)):
                    info = tar.gettarinfo(str(path), arcname=rel)
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                    count += 1
        tag = uuid.uuid4().hex[:8]
        archive = f"{root}/include/.{digest}.{tag}.tar.gz"
        staging = f"{root}/include/.{digest}.{tag}"
        self._sh(f"umask 077 && mkdir -p {shlex.quote(root + '/include')}")
        self.transport.put_bytes(buffer.getvalue(), archive, mode=0o600)
        q = shlex.quote
        self._sh(
            f"mkdir -p {q(staging)} && tar -xzf {q(archive)} --no-same-owner -C {q(staging)} && rm -f {q(archive)} "
            f"&& : > {q(staging + '/.complete')} "
            f"&& if [ -e {q(final)} ]; then rm -rf {q(staging)}; else mv {q(staging)} {q(final)}; fi"
        )
        self.note(f"synced {count} include file(s) to {final}")
        return final

    def _bootstrap(self, script_path: str) -> None:
        from skyward.bootstrap import WARM_PREFIX, parse_step

        last_error = ""
        lock = threading.Lock()

        def on_line(stream: str, line: str) -> None:
            nonlocal last_error
            with lock:
                found = parse_step(line)
                if found is not None:
                    self.step = found
                elif stream == "stderr" and line.strip():
                    last_error = self.redact(line.strip().removeprefix("skyward bootstrap: "))
                self.note(line)

        started = time.monotonic()
        try:
            code = self.transport.stream(f"bash {shlex.quote(script_path)}", on_line,
                                         timeout=self.env.bootstrap_timeout)
        except TimeoutError as exc:
            raise self.fail(f"the environment build took longer than {self.env.bootstrap_timeout:g}s") from exc
        if code == -1:
            raise self.fail("the connection dropped during the environment build")
        if code != 0:
            raise self.fail(f"the bootstrap script failed: {last_error}" if last_error else
                            "the bootstrap script failed", code)
        warm = any(line.startswith(WARM_PREFIX) for line in self.tail)
        self.note(f"environment {'reused' if warm else 'built'} in {time.monotonic() - started:.1f}s")

