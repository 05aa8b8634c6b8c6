"""The DevTools pipe's guard: what the host accepts from the browser is bounded where it is made, inside the browser's
sandbox, before a byte of it reaches the Playwright driver or the validate worker.

Playwright drives Chromium over a pipe (the browser reads commands on fd 3 and writes answers and events on fd 4,
each message JSON ended by a NUL). A page decides much of what travels on it: `console.log` of a 48 MiB string is a
48 MiB event, parsed by the driver (Node, on the host) and handed to the worker; a few of them took the worker from
~170 MiB to ~650 MiB and the driver to ~860 MiB. The browser relay (crewwork/preview/relay.py) therefore starts
Chromium behind `PIPE_GUARD`, a standard-library program in the browser's sandbox (and its cgroup, so its own memory
is capped with the browser's), which copies the pipe both ways and bounds each message from the browser:

- a message of at most `SMALL` bytes passes untouched (nothing in it can be longer than a bound);
- an event has every string longer than `LOG_STRING` (console messages, exceptions, log entries) or `EVENT_STRING`
  (any other event) cut to that length with a note of how much was cut: what the event *is* (a console error, its
  page, its place) always arrives, only its text is shorter;
- an answer larger than `MAX_MESSAGE` becomes an error answer to the same call (the driver's call fails, so a step
  that needed it fails);
- a message larger than `MAX_BUFFERED` is never held whole: its head and tail are kept to say what it was (an answer:
  an error answer as above; a console message or an uncaught exception: a stand-in of the same kind and place whose
  text says what was cut, so an error still counts as one; any other event: dropped and counted);
- past `FLOW_BYTES` forwarded in one flow, strings are cut to `TIGHT_STRING` and answers over `TIGHT_MESSAGE` refused;
- past `CONSOLE_EVENTS` console messages other than errors (`CONSOLE_ERRORS` console errors, `EXCEPTION_EVENTS`
  uncaught exceptions) in one flow, further ones are withheld from the driver but counted by type, so an error among
  them still counts, and the first errors always arrive whole, however many other lines came before (each message
  costs the driver memory while it records the flow's trace: 100,000 small messages took it past its 512 MiB cap).

The guard also checks every network request at every hop: Chromium pauses each request, redirect hops included, in
the Fetch domain, and Playwright continues redirect hops itself without asking its route handler; the guard turns a
`Fetch.continueRequest` for a request whose URL is not the app's origin into `Fetch.failRequest` (BlockedByClient).

What it cut, dropped, refused and blocked is counted; the host reads and resets the counts with two commands of its
own (`Crewwork.stats`, `Crewwork.reset`), answered by the guard and never sent to the browser. A dropped event could
have been a console error, so a flow with any is "not judged" (crewwork/preview/verdict.py).
"""

from __future__ import annotations

SMALL = 64 * 1024
LOG_STRING = 16 * 1024
EVENT_STRING = 1024 * 1024
MAX_MESSAGE = 16 * 1024 * 1024
MAX_BUFFERED = 64 * 1024 * 1024
FLOW_BYTES = 256 * 1024 * 1024
TIGHT_STRING = 1024
TIGHT_MESSAGE = 1024 * 1024
CONSOLE_EVENTS = 5_000
CONSOLE_ERRORS = 1_000
EXCEPTION_EVENTS = 1_000
LOG_EVENTS = ("Runtime.consoleAPICalled", "Runtime.exceptionThrown", "Log.entryAdded")

PIPE_GUARD = (
    f"""
GUARD_SMALL, GUARD_LOG_STRING, GUARD_EVENT_STRING = {SMALL}, {LOG_STRING}, {EVENT_STRING}
GUARD_MAX_MESSAGE, GUARD_MAX_BUFFERED, GUARD_FLOW_BYTES = {MAX_MESSAGE}, {MAX_BUFFERED}, {FLOW_BYTES}
GUARD_TIGHT_STRING, GUARD_TIGHT_MESSAGE = {TIGHT_STRING}, {TIGHT_MESSAGE}
GUARD_LOG_EVENTS = {LOG_EVENTS!r}
GUARD_CONSOLE_EVENTS, GUARD_CONSOLE_ERRORS, GUARD_EXCEPTION_EVENTS = {CONSOLE_EVENTS}, {CONSOLE_ERRORS}, {EXCEPTION_EVENTS}
"""
    + r'''
import json, os, re, threading
def guard(from_driver, to_browser, from_browser, to_driver, origin):
    """Copy the DevTools pipe both ways until the browser's side ends, bounding what the browser sends."""
    locks = {to_browser: threading.Lock(), to_driver: threading.Lock()}
    fresh = lambda: {"messages": 0, "bytes": 0, "cut": {}, "dropped": {}, "refused": 0, "blocked": 0, "largest": 0,
                     "console": 0, "console_errors": 0, "exceptions": 0, "withheld": {}}
    stats = fresh()
    blocked = {}
    def bump(kind, key):
        stats[kind][key] = stats[kind].get(key, 0) + 1
    def send(fd, data):
        with locks[fd]:
            view = memoryview(data + b"\0")
            while view:
                n = os.write(fd, view)
                view = view[n:]
    def same_origin(url):
        return url == origin or url.startswith(origin + "/")
    def cut(value, cap, seen):
        if isinstance(value, str):
            if len(value) <= cap:
                return value
            seen[0] += 1
            return value[:cap] + "…[crewwork: %d characters cut at the browser's pipe]" % (len(value) - cap)
        if isinstance(value, list):
            return [cut(v, cap, seen) for v in value]
        if isinstance(value, dict):
            return {k: cut(v, cap, seen) for k, v in value.items()}
        return value
    def refuse(call_id, session, why):
        stats["refused"] += 1
        doc = {"id": call_id, "error": {"code": -32000, "message": "crewwork: " + why}}
        if session:
            doc["sessionId"] = session
        return json.dumps(doc).encode()
    def oversized(head, tail, size):
        # Too large to hold: what it was, from its first and last bytes (the session id closes every message).
        m = re.match(rb'\{"id":(\d+)', head)
        s = re.search(rb'"sessionId":"([0-9A-Za-z]+)"\}$', tail)
        session = s.group(1).decode() if s else None
        if m:
            return refuse(int(m.group(1)), session, "an answer of %d bytes from the browser is over the %d-byte bound"
                          % (size, GUARD_MAX_BUFFERED))
        m = re.match(rb'\{"method":"([A-Za-z.]{1,100})"', head)
        method = m.group(1).decode() if m else "?"
        note = "crewwork: a %s event of %d bytes, over the pipe's %d-byte bound: its text is not kept" % (
            method, size, GUARD_MAX_BUFFERED)
        params = None
        # What decides a verdict survives: an error event too large to hold still arrives as an error of its kind.
        # Quotes inside strings are escaped, so these patterns can only match the message's own structure.
        if method == "Runtime.consoleAPICalled":
            kind = re.match(rb'\{"method":"Runtime.consoleAPICalled","params":\{"type":"([a-zA-Z]{1,20})"', head)
            ids = re.findall(rb'"executionContextId":(\d{1,12})', tail)
            if kind and ids:
                params = {"type": kind.group(1).decode(), "args": [{"type": "string", "value": note}],
                          "executionContextId": int(ids[-1]), "timestamp": 0}
        elif method == "Runtime.exceptionThrown":
            params = {"timestamp": 0, "exceptionDetails": {"exceptionId": 0, "text": note, "lineNumber": 0,
                                                           "columnNumber": 0}}
        if params is None:
            bump("dropped", method)
            return None
        bump("cut", method)
        doc = {"method": method, "params": params}
        if session:
            doc["sessionId"] = session
        return json.dumps(doc).encode()
    def from_browser_message(msg):
        size = len(msg)
        stats["messages"] += 1
        stats["largest"] = max(stats["largest"], size)
        over = stats["bytes"] > GUARD_FLOW_BYTES
        console = re.match(rb'\{"method":"Runtime.consoleAPICalled","params":\{"type":"([a-zA-Z]{1,20})"', msg[:200])
        if console:
            kind = console.group(1).decode()
            counter, bound = ("console_errors", GUARD_CONSOLE_ERRORS) if kind in ("error", "assert") else (
                "console", GUARD_CONSOLE_EVENTS)
            stats[counter] += 1
            if stats[counter] > bound:
                bump("withheld", kind)
                return None
        elif msg.startswith(b'{"method":"Runtime.exceptionThrown"'):
            stats["exceptions"] += 1
            if stats["exceptions"] > GUARD_EXCEPTION_EVENTS:
                bump("withheld", "exception")
                return None
        if size <= GUARD_SMALL and not msg.startswith(b'{"method":"Fetch.requestPaused"'):
            return msg
        if msg.startswith(b'{"id":') and size <= (GUARD_TIGHT_MESSAGE if over else GUARD_MAX_MESSAGE):
            return msg  # an answer within its bound (a screenshot): passed as it is, never parsed
        try:
            doc = json.loads(msg)
        except (ValueError, RecursionError):
            return oversized(msg[:65536], msg[-65536:], size)
        method = doc.get("method")
        if method is None:
            limit = GUARD_TIGHT_MESSAGE if over else GUARD_MAX_MESSAGE
            if size <= limit:
                return msg
            return refuse(doc.get("id"), doc.get("sessionId"), "an answer of %d bytes from the browser is over the "
                          "%d-byte bound%s" % (size, limit, " left for this flow" if over else ""))
        if method == "Fetch.requestPaused":
            params = doc.get("params") or {}
            url = str((params.get("request") or {}).get("url", ""))
            if not same_origin(url):
                blocked[params.get("requestId")] = True
                while len(blocked) > 10000:
                    blocked.pop(next(iter(blocked)))
            if size <= GUARD_SMALL:
                return msg
        cap = GUARD_LOG_STRING if method in GUARD_LOG_EVENTS else GUARD_EVENT_STRING
        for cap in (GUARD_TIGHT_STRING,) if over else (cap, GUARD_TIGHT_STRING):
            seen = [0]
            try:
                out = json.dumps(cut(doc, cap, seen)).encode()
            except RecursionError:
                break
            if len(out) <= GUARD_MAX_MESSAGE:
                if not seen[0]:
                    return msg  # nothing was over its bound: the browser's own bytes
                bump("cut", method)
                return out
        bump("dropped", method)
        return None
    def from_driver_message(msg):
        if b'"Crewwork.' in msg or b'"Fetch.continueRequest"' in msg:
            try:
                doc = json.loads(msg)
            except ValueError:
                return msg
            method = doc.get("method")
            session = doc.get("sessionId")
            if method in ("Crewwork.stats", "Crewwork.reset"):
                answer = {"id": doc.get("id"), "result": dict(stats)}
                if session:
                    answer["sessionId"] = session
                send(to_driver, json.dumps(answer).encode())
                if method == "Crewwork.reset":
                    stats.update(fresh())
                return None
            params = doc.get("params") or {}
            if method == "Fetch.continueRequest" and blocked.pop(params.get("requestId"), None):
                stats["blocked"] += 1
                doc["method"] = "Fetch.failRequest"
                doc["params"] = {"requestId": params.get("requestId"), "errorReason": "BlockedByClient"}
                return json.dumps(doc).encode()
        return msg
    def split(fd, handle, out):
        parts, size, head, tail, big = [], 0, b"", b"", False
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return
            start = 0
            while True:
                end = chunk.find(b"\0", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                size += len(piece)
                if big:
                    tail = (tail + piece)[-65536:]
                else:
                    parts.append(piece)
                    if size > GUARD_MAX_BUFFERED:
                        whole = b"".join(parts)
                        head, tail, parts, big = whole[:65536], whole[-65536:], [], True
                if end < 0:
                    break
                result = oversized(head, tail, size) if big else handle(b"".join(parts))
                if result is not None:
                    if out == to_driver:
                        stats["bytes"] += len(result)
                    send(out, result)
                parts, size, head, tail, big = [], 0, b"", b"", False
                start = end + 1
    def down():
        try:
            split(from_driver, from_driver_message, to_browser)
        except OSError:
            pass
        try:
            os.close(to_browser)
        except OSError:
            pass
    threading.Thread(target=down, daemon=True).start()
    try:
        split(from_browser, from_browser_message, to_driver)
    except OSError:
        pass
    os._exit(0)
'''
)
"""Standard-library Python, part of the browser relay's script (see the module's docstring)."""
