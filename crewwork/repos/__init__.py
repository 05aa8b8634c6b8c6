"""Repositories wherever they live: URL grammar, credential redaction, operator-held credentials, a per-host bare
mirror cache, fetch and compare-and-swap push (docs/repositories.md).

Submodules import only what they need, so `crewwork.config` can import the settings models of
`crewwork.config.repos` without pulling in git machinery.
"""
