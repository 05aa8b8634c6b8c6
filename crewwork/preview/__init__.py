"""Live preview and acceptance probes: start the changed application in a sandbox, probe it over HTTP and in a
sandboxed browser, and keep what was seen as evidence (docs/preview.md).

What a work item declares is part of the submission's models (`crewwork.models.preview`). Modules: `detect` (how to
start common apps), `relay` and `tunnel` (the only way from the host to the app: unix sockets), `app` (the app in its
sandbox), `httpprobe` and `browser` (the probes), `pipeguard` (bounds the browser's DevTools pipe inside its sandbox), `grading` (the pure decision), `run` (`run_preview`, the one call
the validation step makes). This package's `__init__` imports nothing: the rest pulls in Playwright.
"""
