"""The `docker` and `gvisor` backends: one container per run, through the Docker engine API only.

`docker` (runc) gives namespaces, a seccomp filter, no capabilities and cgroup caps: about 0.3 s to start.
`gvisor` is the same container under gVisor's `runsc` runtime: the command talks to a user-space kernel, so a
host kernel bug is no longer a way out (about 0.7 s). Both run with no network, a read-only root, only the
workspace writable (at `/workspace`, plus a small tmpfs /tmp and any writable `Mount`), a non-root user, no
capabilities and no new privileges. The image's own Python runs everything (crewwork/sandbox/image.py).

The Docker SDK is blocking, so every engine call runs in a thread; the asyncio side owns the deadline and
cancellation, and always removes the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from crewwork.config.sandbox import DockerConfig, SandboxSettings
from crewwork.sandbox._proc import OutputCapture, signal_from_returncode
from crewwork.sandbox.base import (
    WORKSPACE,
    Mount,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxRunResult,
    SandboxUnavailable,
    base_env,
    check_argv_and_workspace,
    check_mounts,
    disk_limited,
    hand_over,
)
from crewwork.sandbox.containerstats import CgroupWatcher, RunscCounter
from crewwork.sandbox.orphans import OWNER_LABEL, process_identity

AVAILABILITY_TTL_S = 5.0
T = TypeVar("T")
DEADLINE_LABEL = "crewwork.sandbox.deadline"
# A container still there this long after its run's timeout lost the worker that owned it.
ORPHAN_GRACE_S = 60
REAP_EVERY_S = 60.0
_last_reap = 0.0
# Beyond the run's own timeout, how long to wait for the engine to report the (killed) container's exit.
WAIT_GRACE_S = 120
_AVAILABILITY: dict[str, tuple[float, tuple[bool, str]]] = {}
ENGINE_HINT = "start a Docker engine (as root: `.ci/docker-up.sh`, or `apt-get install -y docker.io && dockerd &`)"
IMAGE_HINT = "build it with `crewwork sandbox build-image` or set CREWWORK_SANDBOX_DOCKER_IMAGE to a local image"
# gVisor runs the command's processes inside its own kernel, invisible to host pid cgroups, and it fails
# to start with an OCI pids limit on cgroup v1 hosts; it does enforce RLIMIT_NPROC. Its own count of the
# sandbox's tasks (crewwork/sandbox/containerstats.py) is sampled while the container runs: at the cap means the
# cap was hit. How programs report a failed fork backs that up (and, for runc, the sampled cgroup
# counter, which can miss a cap hit in the last few milliseconds before exit).
FORK_FAILURE_MARKERS = (
    b"Cannot fork",
    b"fork: retry",
    b"fork: Resource temporarily unavailable",
    b"BlockingIOError: [Errno 11]",
    b"can't start new thread",
)


def _docker() -> Any:
    import docker

    return docker


class DockerSandbox(Sandbox):
    """A fresh container per run; `runtime` None means the engine default (runc)."""

    name: ClassVar[str] = "docker"
    isolating: ClassVar[bool] = True
    forced_runtime: ClassVar[str | None] = None

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        config = self.settings.backend_config(self.name)
        assert isinstance(config, DockerConfig)
        self.config = config
        self.runtime = self.forced_runtime or config.runtime
        self.image = config.image
        self._client: Any = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ availability

    @classmethod
    def available(cls, settings: SandboxSettings | None = None) -> tuple[bool, str]:
        # Asked before every run by best_available(); the engine is not worth three API calls each time.
        config = (settings or SandboxSettings()).backend_config(cls.name)
        assert isinstance(config, DockerConfig)
        key = (os.environ.get("DOCKER_HOST"), config.model_dump_json())
        hit = _AVAILABILITY.get(str(key))
        if hit is not None and time.monotonic() - hit[0] < AVAILABILITY_TTL_S:
            return hit[1]
        result = cls._probe(config)
        _AVAILABILITY[str(key)] = (time.monotonic(), result)
        return result

    @classmethod
    def _probe(cls, config: DockerConfig) -> tuple[bool, str]:
        runtime = cls.forced_runtime or config.runtime
        try:
            client = _connect(config.base_url)
            info = client.info()
        except SandboxUnavailable as exc:
            return False, str(exc)
        except Exception as exc:
            return False, f"Docker engine did not answer: {exc}; {ENGINE_HINT}"
        runtimes = sorted((info.get("Runtimes") or {}).keys())
        if runtime and runtime not in runtimes:
            return False, (
                f"the Docker engine has no `{runtime}` runtime (has: {', '.join(runtimes)}); install gVisor "
                "(`apt-get install -y runsc`) and register it in /etc/docker/daemon.json (docs/sandbox.md)"
            )
        try:
            client.images.get(config.image)
        except Exception:
            return False, f"image {config.image} is not in the local engine; {IMAGE_HINT}"
        what = f"runtime {runtime}" if runtime else f"runtime {info.get('DefaultRuntime', 'runc')}"
        return True, f"Docker {info.get('ServerVersion', '?')}, {what}, image {config.image}"

    def runner(self) -> dict[str, str]:
        return {"backend": self.name, "image": self.image, "runtime": self.runtime or ""}

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = _connect(self.config.base_url)
            return self._client

    # ------------------------------------------------------------------ run

    def container_kwargs(
        self, argv: Sequence[str], ws: Path, limits: SandboxLimits, env: Mapping[str, str] | None,
        mounts: Sequence[Mount],
    ) -> dict[str, Any]:  # fmt: skip
        docker = _docker()
        environment = base_env("", env)
        if not env or "PATH" not in env:
            del environment["PATH"]  # the image's PATH finds its own python
        # Structured bind mounts, not `volumes` strings: a ':' or ',' in a host path cannot change what is mounted.
        binds = [
            docker.types.Mount(target=m.inside, source=host, type="bind", read_only=not m.writable)
            for host, m in check_mounts(mounts)
        ]
        binds.append(docker.types.Mount(target=WORKSPACE, source=str(ws), type="bind", read_only=False))
        mem = f"{limits.memory_mb}m"
        uid, gid = self.user().split(":")
        kwargs: dict[str, Any] = dict(
            image=self.image,
            command=list(argv),
            working_dir=WORKSPACE,
            user=self.user(),
            environment=environment,
            network_mode="none",
            read_only=True,
            # Owned by the sandbox user: this engine ignores `mode=1777` on tmpfs options, which left /tmp unwritable.
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={limits.tmpfs_mb}m,uid={uid},gid={gid},mode=0700"},
            shm_size=f"{limits.tmpfs_mb}m",
            mounts=binds,
            mem_limit=mem,
            memswap_limit=mem,
            nano_cpus=int(limits.cpus * 1e9),
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            hostname="sandbox",
            log_config={"type": "none", "config": {}},
            labels={
                "crewwork.sandbox": self.name,
                # Lets any worker remove the container if the one that started it died mid-run.
                DEADLINE_LABEL: str(int(time.time() + limits.timeout_s + ORPHAN_GRACE_S)),
                # Lets this host's sweep remove it as soon as that process is gone (reap_dead_owners).
                OWNER_LABEL: process_identity(),
            },
            detach=True,
            stdin_open=False,
        )
        if self.runtime == "runsc":
            kwargs["ulimits"] = [docker.types.Ulimit(name="nproc", soft=limits.pids, hard=limits.pids)]
        else:
            kwargs["pids_limit"] = limits.pids
        if self.runtime:
            kwargs["runtime"] = self.runtime
        return kwargs

    async def run(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: SandboxLimits,
        env: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        stop: asyncio.Event | None = None,
    ) -> SandboxRunResult:
        ws = check_argv_and_workspace(argv, workspace)
        kwargs = self.container_kwargs(argv, ws, limits, env, mounts)
        client = await asyncio.to_thread(self.client)
        await asyncio.to_thread(hand_over, ws, self.settings.owner(), mounts)
        await asyncio.to_thread(reap_orphans, client)
        container = await asyncio.to_thread(self._create, client, kwargs)
        try:
            return await self._run_container(container, limits, ws, stop)
        finally:
            # Also on cancellation: the container (and so the whole process tree) must not outlive us.
            await asyncio.shield(asyncio.to_thread(_remove, container))

    def _create(self, client: Any, kwargs: dict[str, Any]) -> Any:
        docker = _docker()
        try:
            return client.containers.create(**kwargs)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(f"sandbox image {self.image} not found; {IMAGE_HINT}") from exc
        except docker.errors.APIError as exc:
            if "runtime" in str(exc).lower():
                raise SandboxUnavailable(f"Docker runtime {self.runtime!r} is not available: {exc}") from exc
            raise SandboxError(f"creating the sandbox container failed: {exc}") from exc
        except docker.errors.DockerException as exc:
            raise SandboxError(f"Docker engine error: {exc}") from exc

    def _runsc_path(self) -> str:
        """The runsc binary the engine runs (its registered path), for reading gVisor's own counters."""
        try:
            runtimes = self.client().info().get("Runtimes") or {}
            return str((runtimes.get("runsc") or {}).get("path") or "runsc")
        except Exception:
            return "runsc"

    def user(self) -> str:
        """The container's user: the unprivileged sandbox uid (never root, also when the worker is root)."""
        owner = self.settings.owner()
        return f"{owner[0]}:{owner[1]}" if owner is not None else f"{os.geteuid()}:{os.getegid()}"

    async def _run_container(
        self, container: Any, limits: SandboxLimits, ws: Path, stop: asyncio.Event | None = None
    ) -> SandboxRunResult:
        docker = _docker()
        import requests

        out, err = OutputCapture(limits.max_log_bytes), OutputCapture(limits.max_log_bytes)
        try:
            # Attach before start so not a byte of output is missed; the stream ends when the container exits.
            sock = await asyncio.to_thread(
                container.attach, stdout=True, stderr=True, stream=True, logs=False, demux=True
            )
        except docker.errors.DockerException as exc:
            raise SandboxError(f"attaching to the sandbox container failed: {exc}") from exc
        reader = _own_thread(_drain, sock, out, err)
        # Sampling starts before the container does: a command killed by the OOM killer within milliseconds (its
        # cgroup is deleted at exit) must still have been seen.
        watcher = CgroupWatcher(container.id)
        if self.runtime == "runsc":
            watcher.runsc = RunscCounter(await asyncio.to_thread(self._runsc_path), container.id, limits.pids)
        poller = _own_thread(watcher.poll)
        started = time.monotonic()
        try:
            await asyncio.to_thread(container.start)
        except docker.errors.DockerException as exc:
            watcher.stop.set()
            code = command_not_found_code(str(exc))
            if code is None:
                raise SandboxError(f"starting the sandbox container failed: {exc}") from exc
            reader.cancel()
            return SandboxRunResult(
                backend=self.name,
                isolated=True,
                exit_code=code,
                duration_s=time.monotonic() - started,
                stdout=b"",
                stderr=f"{self.name}: {_runtime_message(str(exc))}\n".encode(),
                command_not_found=True,
                enforcement=f"docker+{self.runtime}" if self.runtime else "docker",
            )
        # The SDK's default request timeout (120 s) would cut long runs short; the deadline is ours.
        wait_timeout = int(limits.timeout_s) + WAIT_GRACE_S
        waiter = _own_thread(container.wait, timeout=wait_timeout)
        timed_out = stopped = False
        stopper = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            done, _ = await asyncio.wait(
                {waiter} | ({stopper} if stopper is not None else set()),
                timeout=limits.timeout_s,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if waiter not in done:
                stopped = stopper is not None and stopper in done
                timed_out = not stopped
                await asyncio.to_thread(_kill, container)
            status = await waiter
            duration = time.monotonic() - started
            await asyncio.wait({reader}, timeout=5)
            await asyncio.to_thread(container.reload)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise SandboxError(f"waiting for the sandbox container failed: {exc}") from exc
        finally:
            if stopper is not None:
                stopper.cancel()
            watcher.stop.set()
            with contextlib.suppress(BaseException):
                await asyncio.shield(poller)
            if not waiter.done():
                await asyncio.shield(asyncio.to_thread(_kill, container))
            with contextlib.suppress(BaseException):
                await asyncio.shield(reader)
        state = container.attrs.get("State", {})
        exit_code = status.get("StatusCode", state.get("ExitCode"))
        if state.get("Error"):
            raise SandboxError(f"the container runtime reported: {state['Error']}")
        oom = bool(state.get("OOMKilled")) or watcher.oom_killed
        pids_hit = watcher.pids_limited
        stdout, stderr = out.value(), err.value()
        if not pids_hit and exit_code != 0:
            pids_hit = any(m in stderr or m in stdout for m in FORK_FAILURE_MARKERS)
        return SandboxRunResult(
            backend=self.name,
            isolated=True,
            exit_code=exit_code,
            duration_s=duration,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            stopped=stopped,
            oom_killed=oom,
            pids_limited=pids_hit,
            disk_limited=disk_limited(ws, exit_code, stdout, stderr),
            killed_by_signal=signal_from_returncode(exit_code, shell_style=True),
            peak_memory_bytes=watcher.peak_memory_bytes,
            enforcement=f"docker+{self.runtime}" if self.runtime else "docker",
            truncated=out.truncated or err.truncated,
        )


class GVisorSandbox(DockerSandbox):
    """The docker backend pinned to gVisor's runsc runtime: a user-space kernel between command and host."""

    name: ClassVar[str] = "gvisor"
    forced_runtime: ClassVar[str | None] = "runsc"


# ---------------------------------------------------------------------------- helpers


def _own_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Run a blocking call that lasts as long as the container (the output stream, the wait, the cgroup sampling)
    in a thread of its own. The event loop's default executor has cpu_count + 4 threads (6 on a 2-core machine):
    three such calls per run would fill it with two concurrent runs, and a third run's calls (its cgroup watcher
    among them, which must sample from the first milliseconds) would wait for a thread."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    def body() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = fn(*args, **kwargs)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: no one waits for this any more
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=body, name=f"crewwork-docker-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return fut


def _connect(base_url: str | None) -> Any:
    docker = _docker()
    try:
        client = docker.DockerClient(base_url=base_url, timeout=120) if base_url else docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise SandboxUnavailable(f"cannot reach the Docker engine ({exc}); {ENGINE_HINT}") from exc
    return client


def reap_orphans(
    client: Any, *, force: bool = False, now: float | None = None, only_ids: set[str] | None = None
) -> list[str]:
    """Remove sandbox containers past their deadline label: their worker died before it could.

    The run's deadline lives in the container's own label, so any worker on the engine can clean up after
    any other. Runs at most every REAP_EVERY_S per process unless forced; `only_ids` limits it to some
    containers. Returns the removed ids.
    """
    global _last_reap
    docker = _docker()
    if not force and time.time() - _last_reap < REAP_EVERY_S:
        return []
    _last_reap = time.time()
    now = time.time() if now is None else now
    removed = []
    try:
        # ignore_removed: the SDK inspects each listed container; one removed meanwhile (any other run ending on a
        # busy engine) would otherwise raise NotFound and abandon the whole reap, leaving every orphan in place.
        for c in client.containers.list(all=True, filters={"label": DEADLINE_LABEL}, ignore_removed=True):
            deadline = c.labels.get(DEADLINE_LABEL, "")
            if only_ids is not None and c.id not in only_ids:
                continue
            if deadline.isdigit() and int(deadline) < now:
                with contextlib.suppress(docker.errors.DockerException):
                    c.remove(force=True)
                    removed.append(c.id)
    except docker.errors.DockerException:
        pass  # housekeeping must never fail a run
    return removed


# How the runtimes say that argv[0] cannot be executed (runc, then gVisor's runsc). Mount or image problems use
# other words, so they stay machinery errors.
_NOT_FOUND_MARKERS = ('exec: "', "error finding executable", "failed to load ")


def command_not_found_code(message: str) -> int | None:
    """127 (missing) or 126 (not executable) when a start error says the command cannot run, else None."""
    if not any(m in message for m in _NOT_FOUND_MARKERS):
        return None
    if "permission denied" in message:
        return 126
    if "not found" in message or "no such file or directory" in message:
        return 127
    return None


def _runtime_message(message: str) -> str:
    for marker in _NOT_FOUND_MARKERS:
        at = message.find(marker)
        if at >= 0:
            return message[at:].split(": unknown")[0][:500]
    return message[:500]


def _drain(stream: Any, out: OutputCapture, err: OutputCapture) -> None:
    for chunk_out, chunk_err in stream:
        out.add(chunk_out)
        err.add(chunk_err)


def _kill(container: Any) -> None:
    docker = _docker()
    with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
        container.kill()


def _remove(container: Any) -> None:
    """Remove the container; one already gone (or going) is what we wanted, not an error. NotFound is a subclass
    of APIError, so it must be told apart inside the handler: a suppress() around it never saw it."""
    docker = _docker()
    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if "already in progress" not in str(exc):
            raise SandboxError(f"removing sandbox container {container.id[:12]} failed: {exc}") from exc
