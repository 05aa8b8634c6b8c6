"""The two small programs that run inside sandboxes to connect a preview: standard-library Python only, written
next to the host's sockets and mounted read-only (the reverse of crewwork/sandbox/proxy.py's relay, and that relay).

    probe (host) -> front.sock -> Tunnels (host) <- hub.sock <- APP_RELAY (app sandbox) -> 127.0.0.1:PORT (the app)
    Chromium (browser sandbox) -> 127.0.0.1:PORT -> BROWSER_RELAY -> front.sock -> ...

The app's relay *dials out* to the host's hub socket and keeps a few idle tunnels there; the host hands each
incoming probe connection one of them (`G`), and the relay connects it to the app (`+`, or `-` when nothing listens
yet). Nothing the app does can change what the host connects to: the host only ever accepts on sockets it made in a
directory the sandbox cannot write. The relay is the sandbox's first process: it starts the app with its output
going to the platform's log file (at most `cap` bytes), and exits with the app's exit status.
"""

from __future__ import annotations

from crewwork.preview.pipeguard import PIPE_GUARD
from crewwork.sandbox.pump import RELAY_PUMP

APP_RELAY = (
    RELAY_PUMP
    + r"""
import os, socket, sys, threading, time
hub, port, log_path, cap = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
argv = sys.argv[6:]
IDLE, ACTIVE = 4, 64
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0); os.dup2(w, 1); os.dup2(w, 2)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("crewwork preview: cannot run %s: %s\n" % (argv[0], e)).encode())
        os._exit(127)
os.close(w)
log = open(log_path, "ab", buffering=0)
lock = threading.Lock()
state = {"written": 0}
def note(text):
    with lock:
        room = cap - state["written"]
        if room > 0:
            data = text[:room]
            log.write(data)
            state["written"] += len(data)
def copy():
    while True:
        d = os.read(r, 65536)
        if not d:
            return
        note(d)
out = threading.Thread(target=copy, daemon=True)
out.start()
def connect_unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(hub)
    return s
idle = threading.BoundedSemaphore(IDLE)
active = threading.BoundedSemaphore(ACTIVE)
def tunnel():
    try:
        s = connect_unix()
    except OSError as e:
        if not state.get("warned"):
            state["warned"] = True
            note(("crewwork preview relay: cannot reach the host's socket (%s); under gVisor the runtime needs "
                  "--host-uds=open\n" % e).encode())
        time.sleep(0.5)
        idle.release(); active.release()
        return
    try:
        s.sendall(b"CW1\n")
        go = s.recv(1)
    except OSError:
        go = b""
    idle.release()
    if go != b"G":
        s.close(); active.release()
        return
    try:
        a = socket.create_connection(("127.0.0.1", port), timeout=5)
        a.settimeout(None)
    except OSError:
        try:
            s.sendall(b"-")
        except OSError:
            pass
        s.close(); active.release()
        return
    s.sendall(b"+")
    splice(s, a, active.release)
def dialer():
    while True:
        active.acquire()
        idle.acquire()
        threading.Thread(target=tunnel, daemon=True).start()
threading.Thread(target=dialer, daemon=True).start()
_, status = os.waitpid(pid, 0)
out.join(2)
code = os.waitstatus_to_exitcode(status)
os._exit(128 - code if code < 0 else code)
"""
)

BROWSER_RELAY = (
    RELAY_PUMP
    + PIPE_GUARD
    + r"""
import os, socket, sys, threading
front, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
ACTIVE = 64
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", port))
lst.listen(64)
def front_door():
    u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        u.connect(front)
    except OSError:
        u.close()
        raise
    return u
parent = os.getpid()
if os.fork() == 0:
    # The browser's DevTools pipe (fds 3 and 4, from Playwright) must close when the browser exits: keep none of it.
    keep = lst.fileno()
    os.closerange(3, keep)
    os.closerange(keep + 1, 4096)
    def watchdog():
        import time
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watchdog, daemon=True).start()
    serve(lst, front_door, ACTIVE)
    os._exit(0)
lst.close()
# Chromium talks to the driver through the guard (crewwork/preview/pipeguard.py): two fresh pipes take the place of
# fds 3 and 4 for the browser, and a child copies between them and the driver's, bounding what the browser says.
to_browser_r, to_browser_w = os.pipe()
from_browser_r, from_browser_w = os.pipe()
if os.fork() == 0:
    os.close(to_browser_r)
    os.close(from_browser_w)
    guard(3, to_browser_w, from_browser_r, 4, "http://127.0.0.1:%d" % port)
os.close(to_browser_w)
os.close(from_browser_r)
os.dup2(to_browser_r, 3, inheritable=True)
os.dup2(from_browser_w, 4, inheritable=True)
os.close(to_browser_r)
os.close(from_browser_w)
os.execvp(argv[0], argv)
"""
)
