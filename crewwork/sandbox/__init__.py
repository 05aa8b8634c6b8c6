"""Sandboxes: one interface (`Sandbox.run`), several backends (gvisor, docker, bwrap, and an unsafe `local`).

Typical use:

    from crewwork.config.sandbox import SandboxSettings, resolve_limits
    from crewwork.sandbox.backends import best_available, get_sandbox

    settings = SandboxSettings()
    name, why = best_available(settings)
    sandbox = get_sandbox(name, allow_unsafe=name == "local", settings=settings)
    limits = resolve_limits(spec, settings)
    result = await sandbox.run(["python", "-m", "pytest"], workspace=ws, limits=limits)

The package imports nothing itself, so a process that reads the sandbox settings (crewwork/config/sandbox.py) or
one module of it loads no backend it does not run.
"""
