"""Code intelligence, offline: a repository map (definitions and references per file from tree-sitter, ranked by a
reference graph, cut to a token budget) per tenant registration and commit (docs/mcp.md, "Repository maps").
"""
