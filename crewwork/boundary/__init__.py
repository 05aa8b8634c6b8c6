"""The untrusted-input boundary: everything a tenant, a workspace or a repository hands the host is parsed, checked
or read here, once, with a bound, so the rest of the code receives values that cannot hold a bad one.

    urls.py        the grammar of repository URLs (one parser for submissions and registrations)
    outbound.py    where the platform may send a request a tenant named (address policy, pinned addresses)
    paths.py       repository-relative paths (`RelPath`) from submissions, agent configs and diffs
    safefs.py      reading and removing files beneath a root a sandbox could have touched, never following a link
    jsonvalues.py  JSON from outside (every door: API, MCP, CLI files, client, verifier): one strict parser, bounded
    masking.py     secrets masked when anything is written (events, attempts, webhook payloads, transcripts, error
                   messages, log lines), by one table of secret shapes; text made storable (NUL, surrogates, depth)
"""
