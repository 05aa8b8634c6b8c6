"""The lifecycle's steps, one package each: `crewwork/steps/<step>/__init__.py` holds what the workflow sees (the
step's input and result models and its `Step` policy: queue, local or not, timeouts, retries, which errors mean what
for the item), `crewwork/steps/<step>/activity.py` the activity, a plain function of explicit `Ports`, bound at
worker build time (crewwork/steps/ports.py). The workflow imports only the former, so neither it nor the API
imports agents, sandboxes or repositories."""
