"""Workflow code: deterministic only (no I/O, no clock, no randomness outside the workflow API;
tests/workflows/test_workflow_determinism.py).

    work_item.py  `WorkItemWorkflow`: the lifecycle of one work item
    loop.py       the repair loop's decisions: limits, carry, continue-as-new
    calls.py      one call path for every step (its policy, and what its failure means for the item)
    policies.py   the workflow's named timeouts and retry policies
    bundle.py     `EvidenceBundleWorkflow`: sign one attempt's evidence on request
    replay.py     `ReplayWorkflow`: replay one attempt on the agent pool, the model answered from its transcript
"""
