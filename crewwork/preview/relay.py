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

APP_RELAY = r"""
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
def pump(a, b, done):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    done()
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
    left = [2]
    def done():
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            a.close(); s.close(); active.release()
    threading.Thread(target=pump, args=(s, a, done), daemon=True).start()
    threading.Thread(target=pump, args=(a, s, done), daemon=True).start()
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

BROWSER_RELAY = r"""
import os, socket, sys, threading
front, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", port))
lst.listen(64)
def pump(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def serve():
    while True:
        c, _ = lst.accept()
        u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            u.connect(front)
        except OSError:
            c.close(); u.close(); continue
        threading.Thread(target=pump, args=(c, u), daemon=True).start()
        threading.Thread(target=pump, args=(u, c), daemon=True).start()
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
    serve()
    os._exit(0)
lst.close()
os.execvp(argv[0], argv)
"""
