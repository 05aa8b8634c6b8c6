"""Preview figures, side by side in one run (2-core shared machine: read the ratios, not the absolute times).

1. **Preview start to first probe**, per backend, warm environment: a Flask app (the preview tests' shop, Flask from a
   loopback index in a prepared environment built once before timing) started by `run_preview` exactly as the
   validation step starts it (sandbox, relay, tunnel, readiness polling), until its first HTTP probe is answered.
   p50/p95 over `--runs` previews per backend, the backends interleaved round by round.
2. **Probe overhead**: the same Playwright flow (open the counter page, click Add, wait for "Count: 1") run bare on the
   host (Chromium without a sandbox, the page served by `python -m http.server` on the host's loopback) against
   crewwork's (Chromium in its bwrap sandbox behind the browser relay, the page served by the app in its sandbox
   behind the app relay and the host's tunnel). Launch and flow timed separately, interleaved round by round.

    .venv/bin/python bench/preview.py [--runs 10] [--flows 8] [--backends bwrap,docker,gvisor]

Writes bench/results/preview.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from crewwork.config.sandbox import SandboxSettings  # noqa: E402
from crewwork.models.preview import BrowserFlow, PreviewSpec  # noqa: E402
from crewwork.preview.run import run_preview  # noqa: E402
from crewwork.sandbox.backends import SANDBOXES, get_sandbox  # noqa: E402
from crewwork.sandbox.base import SandboxLimits  # noqa: E402
from crewwork.sandbox.envplan import CacheOwner, SetupPlan  # noqa: E402
from crewwork.sandbox.prepare import PreparedEnvCache  # noqa: E402
from crewwork.temporal.devserver import free_port  # noqa: E402
from tests.preview.conftest import Saved, workspace  # noqa: E402
from tests.preview.test_repair import APP_FIXED, INDEX, JS_FIXED, SHOP  # noqa: E402
from tests.repos.pkgindex import PackageIndex, packages_ready  # noqa: E402

LIMITS = SandboxLimits(memory_mb=1024, pids=256, timeout_s=300)
HTTP_SPEC = {"http": [{"name": "total", "path": "/api/total", "expect": [{"json_path": "$.total", "equals": 7.5}]}]}
FLOW = {
    "name": "add",
    "steps": [{"open": "/"}, {"click": {"role": "button", "name": "Add"}}, {"wait_for_text": "Count: 1"}],
}
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
]  # fmt: skip


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def first_probe(backends: list[str], runs: int, tmp: Path) -> dict[str, Any]:
    settings = SandboxSettings()
    out: dict[str, Any] = {}
    with PackageIndex(tmp / "index") as index:
        envs = {}
        for b in backends:
            cache = PreparedEnvCache(tmp / f"prepared-{b}")
            install = [
                "python",
                "-m",
                "pip",
                "install",
                "--no-cache-dir",
                "-q",
                "--index-url",
                index.url,
                "flask==3.1.3",
            ]
            src = tmp / f"src-{b}"
            src.mkdir()
            t = time.monotonic()
            envs[b] = await cache.get_or_prepare(
                owner=CacheOwner(tenant_id="tn_bench", repository="rp_shop"),
                sandbox=get_sandbox(b, settings=settings),
                repo="shop",
                base_commit="c",
                setup=[install],
                source=src,
                limits=LIMITS,
                plan=SetupPlan(python="python3", allowlist=(index.hostport,)),
            )
            print(f"  {b}: environment built in {time.monotonic() - t:.1f} s (cold; the runs below are warm)")
        samples: dict[str, list[float]] = {b: [] for b in backends}
        ready: dict[str, list[float]] = {b: [] for b in backends}
        for i in range(runs):
            for b in backends:
                d = tmp / f"run-{b}-{i}"
                ws = workspace(d, {"app.py": APP_FIXED, "shop.py": SHOP})
                run = await run_preview(
                    PreviewSpec.model_validate(HTTP_SPEC),
                    sandbox=get_sandbox(b, settings=settings),
                    workspace=ws,
                    limits=LIMITS,
                    env=envs[b].env(),
                    mounts=envs[b].mounts(),
                    settings=settings,
                    scratch=d / "scratch",
                    save=Saved().save,
                    prefix="bench",
                )
                assert run.evidence.http and run.evidence.http[0].status == 200, run.evidence
                samples[b].append(run.timings["first_probe_s"])
                ready[b].append(run.evidence.ready_after_s or 0.0)
    for b in backends:
        xs = samples[b]
        out[b] = {
            "runs": len(xs),
            "first_probe_p50_s": round(statistics.median(xs), 3),
            "first_probe_p95_s": round(pct(xs, 95), 3),
            "ready_p50_s": round(statistics.median(ready[b]), 3),
            "samples_s": [round(x, 3) for x in xs],
        }
    return out


async def bare_flow(site: Path, flows: int, evidence: bool = False) -> tuple[float, list[float]]:
    """The flow on the host's Chromium; with `evidence`, recording what crewwork records (a trace with screenshots
    and snapshots, every request routed to check its origin), to tell the sandbox's cost from the evidence's."""
    from playwright.async_api import async_playwright

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        async with async_playwright() as pw:
            t = time.monotonic()
            browser = await pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            launch = time.monotonic() - t
            times = []
            for _ in range(flows):
                t = time.monotonic()
                context = await browser.new_context(base_url=f"http://127.0.0.1:{port}")
                if evidence:
                    await context.route("**/*", lambda route: route.continue_())
                    await context.tracing.start(screenshots=True, snapshots=True)
                page = await context.new_page()
                await page.goto("/")
                await page.get_by_role("button", name="Add").click()
                await page.get_by_text("Count: 1").first.wait_for(state="visible")
                await page.screenshot(type="png")
                if evidence:
                    await context.tracing.stop(path=str(site.parent / "trace.zip"))
                await context.close()
                times.append(time.monotonic() - t)
            await browser.close()
        return launch, times
    finally:
        server.terminate()
        server.wait(10)


async def crewwork_flow(d: Path, flows: int) -> tuple[float, list[float]]:
    settings = SandboxSettings()
    ws = workspace(d, {"index.html": INDEX, "app.js": JS_FIXED})
    spec = PreviewSpec.model_validate({"browser": [{**FLOW, "name": f"add{i}"} for i in range(flows)]})
    run = await run_preview(
        spec,
        sandbox=get_sandbox("bwrap", settings=settings),
        workspace=ws,
        limits=LIMITS,
        env={},
        mounts=[],
        settings=settings,
        scratch=d / "scratch",
        save=Saved().save,
        prefix="bench",
    )
    assert all(all(s.ok for s in f.steps) for f in run.evidence.flows), run.evidence.flows
    return run.timings["browser_launch_s"], [run.timings[f"flow:add{i}"] for i in range(flows)]


async def overhead(runs: int, flows: int, tmp: Path) -> dict[str, Any]:
    site = tmp / "site"
    site.mkdir()
    (site / "index.html").write_text(INDEX)
    (site / "app.js").write_text(JS_FIXED)
    BrowserFlow.model_validate(FLOW)
    bare_l, bare_f, cw_l, cw_f, ev_l, ev_f = [], [], [], [], [], []
    for i in range(runs):
        launch, times = await bare_flow(site, flows)
        bare_l.append(launch)
        bare_f += times
        launch, times = await bare_flow(site, flows, evidence=True)
        ev_l.append(launch)
        ev_f += times
        launch, times = await crewwork_flow(tmp / f"cw-{i}", flows)
        cw_l.append(launch)
        cw_f += times
    med = statistics.median
    return {
        "rounds": runs,
        "flows_per_round": flows,
        "bare": {
            "launch_p50_s": round(med(bare_l), 3),
            "flow_p50_s": round(med(bare_f), 3),
            "flow_p95_s": round(pct(bare_f, 95), 3),
        },
        "bare_with_evidence": {
            "launch_p50_s": round(med(ev_l), 3),
            "flow_p50_s": round(med(ev_f), 3),
            "flow_p95_s": round(pct(ev_f, 95), 3),
        },
        "crewwork": {
            "launch_p50_s": round(med(cw_l), 3),
            "flow_p50_s": round(med(cw_f), 3),
            "flow_p95_s": round(pct(cw_f, 95), 3),
        },
        "launch_ratio": round(med(cw_l) / med(bare_l), 2),
        "flow_ratio": round(med(cw_f) / med(bare_f), 2),
        "flow_ratio_same_evidence": round(med(cw_f) / med(ev_f), 2),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--flows", type=int, default=8, help="flows per round (a preview holds at most 8)")
    ap.add_argument("--backends", default="bwrap,docker,gvisor")
    ap.add_argument("--only", choices=("first-probe", "overhead"), help="run one of the two parts")
    args = ap.parse_args()
    ok, why = packages_ready()
    if not ok:
        sys.exit(why)
    backends = [b for b in args.backends.split(",") if SANDBOXES[b].available()[0]]
    load = os.getloadavg()[0]
    print(f"preview bench: backends {backends}, load average {load:.1f}")
    with tempfile.TemporaryDirectory(prefix="crewwork-bench-preview-") as tmp:
        first = await first_probe(backends, args.runs, Path(tmp)) if args.only != "overhead" else {}
        print("\npreview start -> first probe answered (Flask, warm environment)")
        print(f"{'backend':8} {'p50 s':>8} {'p95 s':>8} {'ready p50 s':>12}")
        for b, r in first.items():
            print(f"{b:8} {r['first_probe_p50_s']:>8.3f} {r['first_probe_p95_s']:>8.3f} {r['ready_p50_s']:>12.3f}")
        over = await overhead(max(args.runs // 2, 2), args.flows, Path(tmp)) if args.only != "first-probe" else {}
        print("\nthe same Playwright flow: bare on the host vs crewwork (sandboxed browser + tunnel + sandboxed app)")
        print(f"{'':18} {'launch p50 s':>13} {'flow p50 s':>11} {'flow p95 s':>11}")
        for k in ("bare", "bare_with_evidence", "crewwork") if over else ():
            r = over[k]
            print(f"{k:18} {r['launch_p50_s']:>13.3f} {r['flow_p50_s']:>11.3f} {r['flow_p95_s']:>11.3f}")
        if over:
            print(
                f"ratios: launch x{over['launch_ratio']}, flow x{over['flow_ratio']} "
                f"(x{over['flow_ratio_same_evidence']} against bare recording the same evidence)"
            )
    # With --only, the other part's earlier figures are kept.
    out = ROOT / "bench" / "results" / "preview.json"
    result = json.loads(out.read_text()) if out.exists() else {}
    stamp = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_average_at_start": round(load, 1)}
    if first:
        result["first_probe"] = {**stamp, **first}
    if over:
        result["flow_overhead"] = {**stamp, **over}
    out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    from bench.deps import stop_on_sigterm

    stop_on_sigterm()
    asyncio.run(main())
