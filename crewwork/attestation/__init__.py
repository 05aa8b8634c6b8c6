"""Signed evidence bundles: in-toto Statements in DSSE envelopes, signed with the operator's Ed25519 key, that anyone
can verify offline (docs/evidence.md).

    format.py      the bundle's shape, media and predicate types, subject names, every limit
    keys.py        the operator's signing key, public keys and key ids, keys documents, key generation
    treedigest.py  the sha256 of a git tree's content ("crewwork tree digest v1"), from any git directory
    facts.py       what a bundle states, as plain values (gathered from the store by gather.py)
    statements.py  Facts -> in-toto Statements (SLSA Provenance v1, in-toto Test Result, crewwork review)
    sign.py        Statements -> DSSE envelopes -> the bundle's bytes (securesystemslib)
    verify.py      bundle bytes + trusted keys + a repository or files -> what was proven, or what failed
    subjects.py    the digests a verified statement names, checked against files or a repository
    report.py      what verification found, printable with every bundle text escaped
    canonical.py   strict JSON in and canonical JSON out
    publish.py     where a landed change's bundle goes (a git note, the API)
    sandbox_spec.py the sandbox a validation ran in, as stated in provenance
    gather.py      the store's record of a work item -> Facts (server side only)
    (CREWWORK_EVIDENCE_* is crewwork/config/attestation.py, a section of crewwork.config.Settings)

Everything but gather.py runs without crewwork's server: `crewwork verify` needs no store, no Temporal and no network.
"""
