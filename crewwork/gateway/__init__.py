"""The model gateway: the one way out of an agent's sandbox, to the model and nowhere else (docs/gateway.md).

Per attempt, on the agent pool's host, an HTTP endpoint on a unix socket the host owns; the sandbox reaches it through
a relay on its own loopback. It speaks the protocols agent CLIs use, adds the operator's credential, accounts and
bounds every call, and keeps the attempt's transcript.

    dialect.py             what the three protocols share: a request's parts, usage from a body or a stream, errors
    openai_chat.py         OpenAI Chat Completions
    openai_responses.py    OpenAI Responses
    anthropic_messages.py  Anthropic Messages
    ledger.py              the attempt's spend against its budget, and each tenant's call rate
    exchanges.py           the transcript: every exchange, masked and bounded
    httpd.py               a small HTTP/1.1 server (h11) on a unix socket, with bounds on what a client sends
    forwarder.py           `AttemptGateway`: one attempt's gateway (token, routes, forwarding, accounting, stop)
    inner_relay.py         the program inside the sandbox: 127.0.0.1:PORT to the gateway's socket
    upstream.py            where calls go: the operator's endpoints over HTTP, the key added on this side
    replayer.py            answering from a recorded transcript instead of a provider (replay)
"""
