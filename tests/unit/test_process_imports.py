"""What the workflow code and the API process load, measured in a fresh interpreter (sys.modules after the import).

The workflow runs steps by name through its one call path (crewwork/workflows/calls.py) and imports only the steps'
contracts (`crewwork.steps.<step>`: models and policy), so neither it nor the API loads a step's activity, the ports
activities are bound to, or the agent, sandbox and repository code those drive.

The API process loads no agent, no sandbox and none of this host's repository machinery (mirrors, landing, pull
requests): only the agents' config checks and the repositories' registration checks, listed below module by module
with their reasons. A module the API starts to load for another reason fails this test, and a list only ever
shrinks."""

from __future__ import annotations

import json
import subprocess
import sys

STACKS = ("crewwork.agents", "crewwork.sandbox", "crewwork.repos")
STEP_IO = ("crewwork.steps.ports", "crewwork.steps.registry", "crewwork.steps.execution", "crewwork.steps.attempt")
"""The I/O side of the steps (with every `crewwork.steps.<step>.activity`)."""

API_NEEDS = {
    # Submission checks the agent's config and takes its mock label at the edge (crewwork/api/service.py): the catalogue
    # of agent names (crewwork.agents.catalogue) with the built-ins' config models and checks, and the plugin
    # interface (crewwork.agents.base) a plugin is checked against. No agent.
    "crewwork.agents": {
        "crewwork.agents",
        "crewwork.agents.base",
        "crewwork.agents.catalogue",
        "crewwork.agents.command_config",
        "crewwork.agents.model_config",
        "crewwork.agents.scripted_config",
    },
    # Nothing: the sandbox settings are crewwork.config.sandbox.
    "crewwork.sandbox": set(),
    # Repository registration and submission check a repository where it enters (crewwork.repos.tenancy, with
    # crewwork.repos.registration; a submission's repository in one call, crewwork.repos.submission): its URL and the
    # local repository's git directory (crewwork.repos.local), the address policy (crewwork.repos.address), the
    # credential it names (crewwork.repos.credentials), and its ref on the remote, which runs `git ls-remote`
    # (crewwork.repos.remote and the git runner, crewwork.repos.git); a submission's environment is checked by
    # crewwork.repos.environment. The forge intake shows an attempt awaiting review on its pull request (docs/forge.md,
    # "Review where the team reviews"): it pushes the review commit from a mirror (crewwork.repos.worker,
    # crewwork.repos.mirror, crewwork.repos.landing's push_for_review). That git work belongs in a worker pool's
    # step; until it moves there the API process holds a mirror cache for it (a known debt, docs/forge.md).
    "crewwork.repos": {
        "crewwork.repos",
        "crewwork.repos.address",
        "crewwork.repos.credentials",
        "crewwork.repos.environment",
        "crewwork.repos.git",
        "crewwork.repos.landing",
        "crewwork.repos.local",
        "crewwork.repos.mirror",
        "crewwork.repos.worker",
        "crewwork.repos.registration",
        "crewwork.repos.remote",
        "crewwork.repos.submission",
        "crewwork.repos.tenancy",
    },
}


def loaded_by(module: str) -> list[str]:
    """The crewwork modules a fresh interpreter has loaded after `import module`."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(m for m in sys.modules if m.startswith('crewwork'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=180)
    return json.loads(out.stdout.splitlines()[-1])


def _under(modules: list[str], packages: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


def _step_io(modules: list[str]) -> list[str]:
    return [m for m in modules if m in STEP_IO or (m.startswith("crewwork.steps.") and m.endswith(".activity"))]


def test_the_workflows_load_no_activity_agent_sandbox_repository_or_store_code() -> None:
    for module in ("crewwork.workflows.work_item", "crewwork.workflows.bundle"):
        modules = loaded_by(module)
        print(f"{module}: {len(modules)} crewwork modules; stacks: {_under(modules, STACKS)}")
        assert _step_io(modules) == [], module
        assert _under(modules, (*STACKS, "crewwork.store", "crewwork.workspace.tree", "crewwork.config")) == [], module


def test_the_api_process_loads_no_step_activity_and_only_the_listed_stack_modules() -> None:
    modules = loaded_by("crewwork.api.app")
    print(f"crewwork.api.app: {len(modules)} crewwork modules; step activities and ports: {_step_io(modules)}")
    assert _step_io(modules) == []
    for package, needed in API_NEEDS.items():
        found = set(_under(modules, (package,)))
        print(f"  {package}: {len(found)} modules, all listed: {found <= needed}")
        assert found <= needed, f"the API now also loads {sorted(found - needed)}: say why in API_NEEDS, or avoid it"
    assert _under(modules, ("crewwork.workspace.tree", "crewwork.preview.run", "crewwork.validation.protect")) == []
