"""The lifecycle's steps, one package each: admit, lease (the workspace lease, cleanup), state, agent, validate (with
the preview), record, review (a reviewer's decision recorded), land, finish, bundle (one attempt's signed bundle on request).

`crewwork/steps/<step>/contract.py` (re-exported by the step's `__init__.py`) holds what the workflow sees: the step's input and result models and its `Step`
policy (queue or local, timeouts, retries, which errors mean what for the item; `step.py`). `<step>/activity.py`
holds the activity, a plain function `(ports, input) -> result` of explicit `Ports` (`ports.py`), bound at worker
build time from one table (`registry.py`). The workflow and the API import only the former, so neither loads agents,
sandboxes or the activities' repository work.

Shared by the activities: `attempt.py` (an attempt's fenced writes and the watch that keeps it alive and fenced),
`execution.py` (mirror, workspace, artifacts and sandbox choice of the agent and validate steps), `errors.py` (the
error types, and which no retry fixes), `sweep.py` (the per-host sweep of what attempts that died on this host left:
workspaces, mirror and prepared-environment leftovers, Docker sandboxes; run by every pool). The retention passes are
the step `retain`. Telling queued items a freed place was handed to them is `crewwork/admission/handoff.py`,
shared with the reconciler."""
