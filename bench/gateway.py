"""The model gateway's cost: a model call through an attempt's gateway against the same call straight to the provider,
side by side in one run (docs/performance.md, "The model gateway").

Three processes: the provider (tests/fakes/model_server.py, answering at once, so what is measured is the path, not a
model), the gateways (a process of their own, so their CPU is theirs alone: the agent pool's share), and the client
(this process). Figures:

- added latency of a whole call (p50, p95) and of the first streamed byte, gateway / direct;
- the gateway process's CPU per call (whole and streamed);
- 32 concurrent streaming sessions, each its own attempt's gateway (as 32 agent slots), against 32 sessions direct.

    python bench/gateway.py [--calls 300] [--sessions 32] [--per-session 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness import machine, pct, proc_cpu_s, table, write_results  # noqa: E402

ANSWER = "All tests pass now; the fix swaps the sign in add(). " * 40  # ~2 KB, ~90 streamed chunks
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "Fix add() so the tests pass."}]}


def serve_provider() -> None:
    from tests.fakes.model_server import FakeModelServer

    server = FakeModelServer(side_answer=ANSWER).start()
    print(json.dumps({"base_url": server.base_url}), flush=True)
    sys.stdin.read()


def serve_gateways(count: int, base_url: str) -> None:
    from crewwork.config.gateway import GatewaySettings
    from crewwork.gateway.forwarder import AttemptGateway
    from crewwork.gateway.ledger import Budget
    from crewwork.transport.config import TransportConfig

    async def main() -> None:
        tc = TransportConfig.model_validate(
            {"endpoints": {"p": {"base_url": base_url, "model": "fake-model", "api_key_env": "BENCH_KEY",
                                 "price_per_1k_input_usd": 0.001, "price_per_1k_output_usd": 0.002}}}
        )  # fmt: skip
        root = Path(tempfile.mkdtemp(prefix="crewwork-bench-gw-"))
        settings = GatewaySettings(calls_per_minute=0, max_calls=1_000_000)
        gateways = [
            AttemptGateway(
                root=root, transport=tc, route=["p"], settings=settings, budget=Budget(), tenant_id=f"t{i}",
                header={}, env={"BENCH_KEY": "sk-bench-0123456789abcdef"},
            )
            for i in range(count)
        ]  # fmt: skip
        for gw in gateways:
            await gw.__aenter__()
        print(json.dumps([{"socket": str(gw.handle.socket_path), "token": gw.token} for gw in gateways]), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for gw in gateways:
            await gw.__aexit__()

    asyncio.run(main())


def child(*args: str) -> tuple[subprocess.Popen[str], Any]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


async def one_call(client: httpx.AsyncClient, url: str, headers: dict[str, str], stream: bool) -> tuple[float, float]:
    """(seconds to the whole answer, seconds to its first byte)."""
    started = time.perf_counter()
    first = None
    async with client.stream("POST", url, json={**BODY, "stream": stream}, headers=headers) as response:
        async for _chunk in response.aiter_raw():
            if first is None:
                first = time.perf_counter() - started
        assert response.status_code == 200, response.status_code
    total = time.perf_counter() - started
    return total, first if first is not None else total


async def series(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], stream: bool, n: int
) -> list[tuple[float, float]]:
    for _ in range(5):  # warm the connections
        await one_call(client, url, headers, stream)
    return [await one_call(client, url, headers, stream) for _ in range(n)]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    provider, info = child("--provider")
    gws, handles = child("--gateways", str(args.sessions), info["base_url"])
    base = info["base_url"]
    out: dict[str, Any] = {}
    try:
        direct = httpx.AsyncClient(timeout=60)
        gw0 = handles[0]
        via = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=gw0["socket"]), timeout=60)
        auth = {"authorization": f"Bearer {gw0['token']}"}
        key = {"authorization": "Bearer sk-bench-0123456789abcdef"}
        for stream in (False, True):
            # Interleaved rounds, so drift on a shared machine falls on both sides alike.
            d_all: list[tuple[float, float]] = []
            g_all: list[tuple[float, float]] = []
            cpu_before = proc_cpu_s(gws.pid)
            g_calls = 0
            for _ in range(5):
                d_all += await series(direct, f"{base}/chat/completions", key, stream, args.calls // 5)
                g_all += await series(via, "http://gw/v1/chat/completions", auth, stream, args.calls // 5)
                g_calls += args.calls // 5 + 5
            cpu = (proc_cpu_s(gws.pid) - cpu_before) / g_calls
            name = "streamed" if stream else "whole"
            out[name] = {
                "direct_p50_ms": pct([t for t, _ in d_all], 50) * 1000,
                "direct_p95_ms": pct([t for t, _ in d_all], 95) * 1000,
                "gateway_p50_ms": pct([t for t, _ in g_all], 50) * 1000,
                "gateway_p95_ms": pct([t for t, _ in g_all], 95) * 1000,
                "direct_ttfb_p50_ms": pct([f for _, f in d_all], 50) * 1000,
                "gateway_ttfb_p50_ms": pct([f for _, f in g_all], 50) * 1000,
                "direct_ttfb_p95_ms": pct([f for _, f in d_all], 95) * 1000,
                "gateway_ttfb_p95_ms": pct([f for _, f in g_all], 95) * 1000,
                "gateway_cpu_ms_per_call": cpu * 1000,
            }
        await direct.aclose()
        await via.aclose()
        out["concurrent"] = await concurrent(args, base, handles, gws.pid)
    finally:
        for proc in (gws, provider):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)
    return out


async def concurrent(args: argparse.Namespace, base: str, handles: list[dict[str, str]], gw_pid: int) -> dict[str, Any]:
    """`sessions` streaming sessions at once, each `per_session` calls in a row: direct, then each through its own
    attempt's gateway."""

    async def session(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> list[tuple[float, float]]:
        return [await one_call(client, url, headers, True) for _ in range(args.per_session)]

    results: dict[str, Any] = {}
    for side in ("direct", "gateway"):
        clients = []
        jobs = []
        for h in handles[: args.sessions]:
            if side == "direct":
                c = httpx.AsyncClient(timeout=120)
                jobs.append((c, f"{base}/chat/completions", {"authorization": "Bearer sk-bench-0123456789abcdef"}))
            else:
                c = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=h["socket"]), timeout=120)
                jobs.append((c, "http://gw/v1/chat/completions", {"authorization": f"Bearer {h['token']}"}))
            clients.append(c)
        cpu_before = proc_cpu_s(gw_pid)
        started = time.perf_counter()
        done = await asyncio.gather(*(session(c, u, h) for c, u, h in jobs))
        wall = time.perf_counter() - started
        cpu = proc_cpu_s(gw_pid) - cpu_before
        for c in clients:
            await c.aclose()
        times = [t for s in done for t, _ in s]
        firsts = [f for s in done for _, f in s]
        results[side] = {
            "wall_s": wall,
            "calls_per_s": len(times) / wall,
            "p50_ms": pct(times, 50) * 1000,
            "p95_ms": pct(times, 95) * 1000,
            "ttfb_p50_ms": pct(firsts, 50) * 1000,
            "ttfb_p95_ms": pct(firsts, 95) * 1000,
            "gateway_cpu_ms_per_call": (cpu * 1000 / len(times)) if side == "gateway" else None,
        }
    return results


def report(out: dict[str, Any], args: argparse.Namespace) -> str:
    rows = []
    for name in ("whole", "streamed"):
        r = out[name]
        rows.append(
            [
                f"{name}: call p50",
                f"{r['direct_p50_ms']:.2f}",
                f"{r['gateway_p50_ms']:.2f}",
                f"{r['gateway_p50_ms'] / r['direct_p50_ms']:.2f}x",
                f"+{r['gateway_p50_ms'] - r['direct_p50_ms']:.2f}",
            ]
        )
        rows.append(
            [
                f"{name}: call p95",
                f"{r['direct_p95_ms']:.2f}",
                f"{r['gateway_p95_ms']:.2f}",
                f"{r['gateway_p95_ms'] / r['direct_p95_ms']:.2f}x",
                f"+{r['gateway_p95_ms'] - r['direct_p95_ms']:.2f}",
            ]
        )
        rows.append(
            [
                f"{name}: first byte p50",
                f"{r['direct_ttfb_p50_ms']:.2f}",
                f"{r['gateway_ttfb_p50_ms']:.2f}",
                f"{r['gateway_ttfb_p50_ms'] / r['direct_ttfb_p50_ms']:.2f}x",
                f"+{r['gateway_ttfb_p50_ms'] - r['direct_ttfb_p50_ms']:.2f}",
            ]
        )
        rows.append([f"{name}: gateway CPU / call", "", f"{r['gateway_cpu_ms_per_call']:.2f}", "", ""])
    c = out["concurrent"]
    d, g = c["direct"], c["gateway"]
    label = f"{args.sessions} streaming sessions"
    rows.append(
        [
            f"{label}: calls/s",
            f"{d['calls_per_s']:.0f}",
            f"{g['calls_per_s']:.0f}",
            f"{g['calls_per_s'] / d['calls_per_s']:.2f}x",
            "",
        ]
    )
    rows.append(
        [
            f"{label}: call p50",
            f"{d['p50_ms']:.1f}",
            f"{g['p50_ms']:.1f}",
            f"{g['p50_ms'] / d['p50_ms']:.2f}x",
            f"+{g['p50_ms'] - d['p50_ms']:.1f}",
        ]
    )
    rows.append(
        [
            f"{label}: call p95",
            f"{d['p95_ms']:.1f}",
            f"{g['p95_ms']:.1f}",
            f"{g['p95_ms'] / d['p95_ms']:.2f}x",
            f"+{g['p95_ms'] - d['p95_ms']:.1f}",
        ]
    )
    rows.append(
        [
            f"{label}: first byte p95",
            f"{d['ttfb_p95_ms']:.1f}",
            f"{g['ttfb_p95_ms']:.1f}",
            f"{g['ttfb_p95_ms'] / d['ttfb_p95_ms']:.2f}x",
            f"+{g['ttfb_p95_ms'] - d['ttfb_p95_ms']:.1f}",
        ]
    )
    rows.append([f"{label}: gateway CPU / call", "", f"{g['gateway_cpu_ms_per_call']:.2f}", "", ""])  # fmt: skip
    return table(["figure (ms unless said)", "direct", "gateway", "ratio", "added"], rows)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--provider":
        serve_provider()
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--gateways":
        serve_gateways(int(sys.argv[2]), sys.argv[3])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=300, help="calls per side and kind (whole, streamed)")
    p.add_argument("--sessions", type=int, default=32, help="concurrent streaming sessions")
    p.add_argument("--per-session", type=int, default=10, help="calls per concurrent session")
    args = p.parse_args()
    out = asyncio.run(measure(args))
    print(report(out, args))
    path = write_results("gateway", {"machine": machine(), "args": vars(args), **out})
    print(f"results: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
