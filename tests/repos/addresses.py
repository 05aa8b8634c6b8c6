"""What the address tests name: every spelling of an internal address, and an attacker's DNS."""

from __future__ import annotations

import ipaddress

from crewwork.boundary.outbound import IPAddress
from tests.repos.servers import Listener

NAME = "gitbox.test"

# Every way to name this host's own services or the operator's network, and the category the refusal must name.
# {p4} / {p6}: a listener on 127.0.0.1 / ::1 that must see no connection.
INTERNAL: list[tuple[str, str]] = [
    ("http://127.0.0.1:{p4}/acme/calc.git", "loopback"),
    ("https://localhost:{p4}/acme/calc.git", "loopback"),
    ("http://2130706433:{p4}/acme/calc.git", "loopback"),  # one number: what getaddrinfo, curl and ssh read
    ("http://0x7f.1:{p4}/acme/calc.git", "loopback"),
    ("http://0177.0.0.1:{p4}/acme/calc.git", "loopback"),  # octal
    ("http://127.1:{p4}/acme/calc.git", "loopback"),
    ("http://0:{p4}/acme/calc.git", "unspecified"),  # 0.0.0.0: Linux connects it to this host
    ("http://0.0.0.0:{p4}/acme/calc.git", "unspecified"),
    ("http://[::1]:{p6}/acme/calc.git", "loopback"),
    ("http://[::]:{p6}/acme/calc.git", "unspecified"),
    ("http://[::ffff:127.0.0.1]:{p4}/acme/calc.git", "embeds the loopback"),  # IPv4-mapped
    ("http://[::ffff:7f00:1]:{p4}/acme/calc.git", "embeds the loopback"),
    ("http://[64:ff9b::7f00:1]:{p4}/acme/calc.git", "embeds the loopback"),  # NAT64
    ("http://[2002:7f00:1::]:{p4}/acme/calc.git", "embeds the loopback"),  # 6to4
    ("ssh://git@127.0.0.1:{p4}/acme/calc.git", "loopback"),
    ("ssh://git@localhost:{p4}/acme/calc.git", "loopback"),
    ("ssh://github.com@2130706433:{p4}/acme/calc.git", "loopback"),  # the part before @ is the login, not the host
    ("git+ssh://git@0x7f.1:{p4}/acme/calc.git", "loopback"),
    ("root@127.0.0.1:acme/calc.git", "loopback"),  # scp-style
    ("git@[::1]:acme/calc.git", "loopback"),
    ("git://127.0.0.1:{p4}/acme/calc.git", "loopback"),
    ("git://2130706433:{p4}/acme/calc.git", "loopback"),
    ("git://[::1]:{p6}/acme/calc.git", "loopback"),
    ("http://169.254.169.254/latest/meta-data", "link-local"),  # cloud metadata
    ("http://[fe80::1]/acme/calc.git", "link-local"),
    ("http://[64:ff9b::a9fe:a9fe]/acme/calc.git", "embeds the link-local"),  # NAT64 of the metadata address
    ("http://10.1.2.3/acme/calc.git", "private"),
    ("ssh://git@172.16.0.1/acme/calc.git", "private"),
    ("git://192.168.1.1/acme/calc.git", "private"),
    ("http://[fc00::1]/acme/calc.git", "private"),
    ("http://[fec0::1]/acme/calc.git", "site-local"),  # RFC 3879 deprecated it, networks still route it
    ("http://100.64.0.1/acme/calc.git", "not globally routable"),  # shared address space
    ("http://224.0.0.1/acme/calc.git", "multicast"),
    ("http://240.0.0.1/acme/calc.git", "private|reserved"),  # 240/4: Python files it under private
    ("https://192.0.2.10/acme/calc.git", "private"),  # documentation range
]


def spell(template: str, listeners: tuple[Listener, Listener]) -> str:
    return template.format(p4=listeners[0].port, p6=listeners[1].port)


class Dns:
    """An attacker's DNS: answers the test sets (and may change between two questions); NXDOMAIN otherwise."""

    def __init__(self, **answers: list[str]) -> None:
        self.answers = {k.replace("_", "."): v for k, v in answers.items()}
        self.asked: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.asked.append(host)
        if host not in self.answers:
            raise OSError("NXDOMAIN")
        return [ipaddress.ip_address(a) for a in self.answers[host]]
