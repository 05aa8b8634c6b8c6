"""Agents: the plugin interface and the built-in agents, run by the agent pool inside a sandbox's workspace.

base.py        the interface every agent implements (`Agent`, its context and outcome), re-exported failures
classes.py     the agent classes by name, for the agent pool: the built-ins and the `crewwork.agents` plugins
catalogue.py   the names, their config checks and mock labels, for the API (loads no agent)
scripted.py    the deterministic scripted agent (always labelled mock; fault injection for tests)
model.py       the model agent: an edit loop over an OpenAI-compatible endpoint (prompt: model_prompt.py)
command.py     an agent CLI run as a command in the sandbox
edits.py       applying an agent's edits to a workspace, beneath its root
isolation.py, zygote.py, child.py   running an agent in a child process of its own
*_config.py    each agent's submission config and its checks
"""
