"""Security scanners as evidence, offline (issue 45, item 4; docs/scanners.md): the pure parts.

    sandbox_scan.py  the runner executed inside the sandbox (never imported by crewwork): SARIF out
    sarif.py         bounded SARIF reading and the evidence log (baselineState new/unchanged)
    requirements.py  dependency changes from the diff text (bounded, host-side)
    findings.py      what the change introduces, and what the policy blocks
    decide.py        the scanners' part of the verdict

The kit the sandbox mounts (crewwork/steps/validate/scankit.py) and the stage that runs the scanners in one validation
(crewwork/steps/validate/scanning.py) live with the validate step: they drive the sandbox.
"""
