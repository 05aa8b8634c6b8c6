"""The workspace: the one directory an agent or a test run may change, and the host's git around it.

    tree.py     making a workspace at a base commit and capturing its change, without trusting anything in it
    gitops.py   git on the host: refs, private per-workspace git directories, trees, diffs, landing commits
    childio.py  writing to a child process's stdin on either event loop
    liveness.py the lock a live workspace's process holds (the kernel drops it when the process dies; the host
                sweep, crewwork/steps/sweep.py, removes what no live process holds)

The workspace *lease* (one writer per repository branch) is a step: crewwork/steps/lease.
"""
