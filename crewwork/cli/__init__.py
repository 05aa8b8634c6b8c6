"""The command line, and the processes it starts.

    main.py       the `crewwork` parser, its output rules and exit codes (`run` is the console script)
    items.py      commands on work items over the HTTP API (submit, status, wait, review, ...), via crewwork.client
    repos.py      repository registrations over the API
    bundles.py    `bundle`, `verify` (offline) and `signing-key`
    ops.py        commands that run crewwork itself: dev, demo, worker, api, db, keys, config, reconcile
    common.py     shared output, input files and exit codes
    serve.py      the API process's application: the HTTP API with the MCP endpoint mounted
    stack.py      the embedded single-host stack behind `dev` and `demo` (Temporal dev server, API, pools)
    demo.py       `crewwork demo`: one code-change work item end to end
    eventloop.py  the event loop the long-running processes run on
    render.py     plain-text rendering of a work item (status, the demo's summary)

This file imports nothing: the API process imports `crewwork.cli.serve` without loading the parser.
"""
