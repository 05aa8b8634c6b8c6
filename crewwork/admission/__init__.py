"""Admission: what a tenant may ask for, and when its work may start.

    policy.py     the operator's policy for one submission: agents, backends, budgets within ceilings (a 422 naming
                  the field, never later)
    starts.py     the admission decision (the tenant's in-flight limit, first come first served) and starting an
                  admitted item's workflow
    handoff.py    handing a freed place on: the write that ends an item's hold admits the tenant's next queued items
    reconcile.py  closing the record of an item whose workflow ended without saying so, handing its place on

The submission service that calls these for the API is crewwork/api/service.py; the `admit` step
(crewwork/steps/admit) and the finishing steps use `starts` and `handoff` from the workflow's side.
"""
