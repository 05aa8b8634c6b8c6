"""What a command inside a real sandbox can do to the host, on every isolating backend, and what the host reads back.

These run commands directly through `Sandbox.run` in a real `Workspace` (the same objects the activities use),
so each backend's boundary is tested on its own, without a workflow around it.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from crewwork.config.sandbox import SandboxSettings
from crewwork.sandbox.backends import get_sandbox
from crewwork.sandbox.base import Mount, Sandbox, SandboxLimits
from crewwork.sandbox.bwrap import ETC_ALLOWLIST, SYNTHETIC_ETC
from crewwork.sandbox.disk import workspace_disk_mb
from crewwork.steps.execution import read_report
from crewwork.workspace.tree import Workspace, gitops
from tests.conftest import make_repo
from tests.security.conftest import require

LIMITS = SandboxLimits(memory_mb=256, pids=64, cpus=1.0, timeout_s=60, tmpfs_mb=32, disk_mb=64)


@pytest.fixture(
    params=["bwrap", pytest.param("docker", marks=pytest.mark.docker), pytest.param("gvisor", marks=pytest.mark.docker)]
)
def sandbox(request: pytest.FixtureRequest) -> Sandbox:
    return get_sandbox(require(request.param), settings=SandboxSettings())


@pytest.fixture
async def ws(tmp_path: Path) -> AsyncIterator[Workspace]:
    repo = make_repo(tmp_path / "repo", {"calc.py": "x = 1\n"})
    settings = SandboxSettings()
    commit = (await gitops.git("rev-parse", "HEAD", cwd=repo)).out.strip()
    w = await Workspace.create(
        git_dir=gitops.git_dir_of(repo),
        home=tmp_path / "ws-home",
        commit=commit,
        disk_mb=workspace_disk_mb(settings, LIMITS),
        owner=settings.owner(),
    )
    yield w
    await w.remove()


async def run_py(sandbox: Sandbox, ws: Workspace, code: str, *args: str, **kw: object) -> dict:
    r = await sandbox.run(["python3", "-c", code, *args], workspace=ws.path, limits=LIMITS, **kw)  # type: ignore[arg-type]
    assert r.exit_code == 0, (r.exit_code, r.stdout[-2000:], r.stderr[-2000:])
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


async def test_files_created_inside_belong_to_an_unprivileged_host_uid(sandbox: Sandbox, ws: Workspace) -> None:
    out = await run_py(
        sandbox, ws, "import os, json; open('made-inside', 'w').write('x'); print(json.dumps({'uid': os.getuid()}))"
    )
    owner = os.stat(ws.path / "made-inside").st_uid
    assert owner != 0, "the sandbox wrote a file as host root"
    if os.geteuid() == 0:
        assert owner == SandboxSettings().uid
    assert out["uid"] != 0


async def test_root_only_host_files_are_unreadable_inside(sandbox: Sandbox, ws: Workspace, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    (shared / "root-only.key").write_text("ROOT-ONLY-KEY-22b1\n")
    (shared / "root-only.key").chmod(0o600)
    os.chmod(shared, 0o755)
    code = (
        "import json, sys\nout = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n        out[p] = open(p).read()\n"
        "    except OSError as e:\n        out[p] = 'denied %d' % e.errno\n"
        "print(json.dumps(out))\n"
    )
    targets = ["/crewwork/shared/root-only.key", "/etc/shadow", "/etc/shadow-", "/etc/gshadow-", "/etc/docker/key.json"]
    out = await run_py(sandbox, ws, code, *targets, mounts=[Mount(shared, "/crewwork/shared")])
    assert out["/crewwork/shared/root-only.key"].startswith("denied")
    for p in targets[1:]:
        if os.path.exists(p):
            host = Path(p).read_text(errors="replace")
            assert out[p] != host and (not host.strip() or host.strip()[:20] not in out[p]), f"{p} leaked"


@pytest.mark.parametrize("name", ["bwrap"])
async def test_bwrap_sees_only_the_etc_allowlist(name: str, ws: Workspace) -> None:
    sandbox = get_sandbox(require(name))
    out = await run_py(sandbox, ws, "import os, json; print(json.dumps(sorted(os.listdir('/etc'))))")
    allowed = {p.split("/")[2].split("*")[0] for p in ETC_ALLOWLIST} | {p.split("/")[2] for p in SYNTHETIC_ETC}
    extra = [n for n in out if not any(n == a or (a.endswith(".") and n.startswith(a)) for a in allowed)]
    assert extra == [], f"/etc entries outside the allowlist are visible: {extra}"
    assert "shadow" not in out and "shadow-" not in out and "docker" not in out and "ssh" not in out


async def test_tiocsti_cannot_push_input_to_any_terminal(sandbox: Sandbox, ws: Workspace) -> None:
    code = (
        "import fcntl, json, os, termios\nout = {}\n"
        "for fd in (0, 1, 2):\n"
        "    try:\n        fcntl.ioctl(fd, termios.TIOCSTI, b'x'); out[fd] = 'injected'\n"
        "    except OSError as e:\n        out[fd] = e.errno\n"
        "try:\n    t = os.open('/dev/tty', os.O_RDWR); fcntl.ioctl(t, termios.TIOCSTI, b'x'); out['tty'] = 'injected'\n"
        "except OSError as e:\n    out['tty'] = e.errno\n"
        "print(json.dumps(out))\n"
    )
    out = await run_py(sandbox, ws, code)
    assert "injected" not in out.values(), out


async def test_worker_environment_is_not_visible_through_proc(
    sandbox: Sandbox, ws: Workspace, worker_secret: str
) -> None:
    code = (
        "import glob, json\nseen = []\n"
        "for p in ['/proc/1/environ', '/proc/self/environ', *glob.glob('/proc/[0-9]*/environ')]:\n"
        "    try:\n        seen.append(open(p, 'rb').read().decode(errors='replace'))\n"
        "    except OSError:\n        pass\n"
        "print(json.dumps(seen))\n"
    )
    seen = await run_py(sandbox, ws, code)
    assert seen, "no environ was readable at all (the probe did not run)"
    assert not any(worker_secret in s or "CREWWORK_TEST_WORKER_SECRET" in s for s in seen)


async def test_hard_links_to_host_files_and_device_nodes_cannot_be_made(sandbox: Sandbox, ws: Workspace) -> None:
    code = (
        "import json, os, stat, sys\nout = {}\n"
        "for src in ['/usr/bin/env', '/etc/passwd', sys.executable]:\n"
        "    try:\n        os.link(os.path.realpath(src), 'linked-' + os.path.basename(src)); out[src] = 'linked'\n"
        "    except OSError as e:\n        out[src] = e.errno\n"
        "try:\n    os.mknod('dev-null', stat.S_IFCHR | 0o666, os.makedev(1, 3)); out['mknod'] = 'made'\n"
        "except OSError as e:\n    out['mknod'] = e.errno\n"
        "print(json.dumps(out))\n"
    )
    out = await run_py(sandbox, ws, code)
    assert "linked" not in out.values() and out["mknod"] != "made", out


VARIANTS = r"""
import json, os, socket, sys
os.makedirs('.crewwork', exist_ok=True)
os.chdir('.crewwork')
os.mkfifo('fifo.xml')
os.mkdir('dir.xml')
os.symlink(sys.argv[1], 'link.xml')
open('hard-src.xml', 'w').write('<testsuite/>')
os.link('hard-src.xml', 'hard.xml')
s = socket.socket(socket.AF_UNIX); s.bind('sock.xml')
os.symlink('/', 'up')
with open('big.xml', 'wb') as f:
    f.truncate(1 << 31)
open('ok.xml', 'w').write('<testsuite tests="0"/>')
print(json.dumps("made"))
"""


async def test_report_path_variants_are_refused_by_the_host(sandbox: Sandbox, ws: Workspace, host_dir: Path) -> None:
    ws.make_dir(".crewwork")
    started = time.monotonic()
    await run_py(sandbox, ws, VARIANTS, str(host_dir / "secret.txt"))
    expect = {
        "fifo.xml": "FIFO",
        "dir.xml": "directory",
        "link.xml": "symbolic link",
        "hard.xml": "hard link",
        "sock.xml": "socket",
        "up/etc/passwd": "symbolic link",
        "big.xml": "limit",
    }
    for name, why in expect.items():
        data, refused = read_report(ws.path, f".crewwork/{name}", 16 * 1024 * 1024)
        assert data is None, name
        if os.path.lexists(ws.path / ".crewwork" / name.split("/")[0]):
            assert refused is not None and why in refused, (name, refused)
        else:
            # gVisor keeps FIFOs and sockets inside its own kernel: the host sees no entry, hence no report.
            assert sandbox.name == "gvisor" and name in ("fifo.xml", "sock.xml"), name
    data, refused = read_report(ws.path, ".crewwork/ok.xml", 16 * 1024 * 1024)
    assert data == b'<testsuite tests="0"/>' and refused is None
    assert time.monotonic() - started < 120, "reading a FIFO must never block"


SWAPPER = r"""
import json, os, sys, time
os.makedirs('.crewwork', exist_ok=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        # A detached process that keeps swapping the report between a file and a link to a host secret.
        while True:
            for make in (lambda p: open(p, 'w').write('<testsuite/>'), lambda p: os.symlink(sys.argv[1], p)):
                try:
                    os.unlink('.crewwork/race.xml.tmp')
                except OSError:
                    pass
                make('.crewwork/race.xml.tmp')
                os.replace('.crewwork/race.xml.tmp', '.crewwork/race.xml')
    os._exit(0)
time.sleep(0.5)
print(json.dumps("forked"))
"""


async def test_no_process_outlives_the_run_so_nothing_races_the_hosts_read(
    sandbox: Sandbox, ws: Workspace, host_dir: Path
) -> None:
    await run_py(sandbox, ws, SWAPPER, str(host_dir / "secret.txt"))
    target = ws.path / ".crewwork" / "race.xml"
    first = os.lstat(target)
    time.sleep(0.5)
    later = os.lstat(target)
    assert (first.st_ino, first.st_mtime_ns) == (later.st_ino, later.st_mtime_ns), "a sandbox process outlived the run"
    for _ in range(50):
        data, _refused = read_report(ws.path, ".crewwork/race.xml", 1 << 20)
        assert data is None or b"HOST-SECRET" not in data


async def test_setuid_binaries_grant_nothing(sandbox: Sandbox, ws: Workspace) -> None:
    out = await run_py(
        sandbox,
        ws,
        "import ctypes, json, os; nnp = ctypes.CDLL(None).prctl(39, 0, 0, 0, 0); "
        "print(json.dumps({'euid': os.geteuid(), 'nnp': nnp}))",
    )
    assert out["euid"] != 0 and out["nnp"] == 1, out


def test_workspace_mount_is_nosuid_and_nodev(tmp_path: Path) -> None:
    from crewwork.sandbox.disk import MOUNT_OPTIONS

    assert "nosuid" in MOUNT_OPTIONS and "nodev" in MOUNT_OPTIONS


@pytest.mark.skipif(os.geteuid() != 0, reason="loop-mounted workspaces need root")
async def test_workspace_is_its_own_file_system_owned_by_the_sandbox_user(ws: Workspace) -> None:
    assert ws.disk is not None
    st = os.stat(ws.path)
    assert st.st_dev != os.stat(ws.home).st_dev
    assert st.st_uid == SandboxSettings().uid and stat.S_IMODE(st.st_mode) == 0o755
    out = subprocess.run(["findmnt", "-no", "OPTIONS", str(ws.path)], capture_output=True, text=True).stdout
    assert "nosuid" in out and "nodev" in out
