"""The program that runs first inside an agent's sandbox: it listens on the sandbox's own 127.0.0.1:PORT and carries
each connection to the gateway's unix socket (mounted read-only from a directory the host owns; the host only ever
accepts on it), then execs the agent. Standard-library Python only; the sandbox's own interpreter runs it.

    python3 RELAY SOCKET PORT -- argv...

The forwarder is a forked child that exits when the agent does. Connections are carried byte for byte: what the
agent may say to the gateway is decided by the gateway, not here.
"""

from __future__ import annotations

RELAY = r"""
import os, socket, sys, threading, time
sock_path, port, argv = sys.argv[1], int(sys.argv[2]), sys.argv[4:]
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", port))
lst.listen(64)
def connect_unix():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sock_path)
    return s
try:
    connect_unix().close()
except OSError as e:
    sys.stderr.write("crewwork model gateway: cannot reach the gateway's socket (%s); under gVisor the runtime "
                     "needs --host-uds=open\n" % e)
    sys.exit(97)
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
        try:
            u = connect_unix()
        except OSError:
            c.close(); continue
        threading.Thread(target=pump, args=(c, u), daemon=True).start()
        threading.Thread(target=pump, args=(u, c), daemon=True).start()
parent = os.getpid()
if os.fork() == 0:
    try:
        os.setsid()
    except OSError:
        pass
    def watchdog():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)
    threading.Thread(target=watchdog, daemon=True).start()
    serve()
    os._exit(0)
lst.close()
os.execvp(argv[0], argv)
"""
