"""Load test of ``marl serve`` on loopback: concurrent clients while slow clients hold
connections with headers that never end.

One run, bounded in count and time:

* the server is the real command, ``marl serve`` in its own process, on 127.0.0.1 with a free
  port, serving the solver-critic-judge team on the tiny-random model (the tests' tiny team);
* ``--clients`` (100) concurrent clients each send ``--requests`` (2) chat completions in turn,
  the first plain and the second streamed; each reply counts as ok (200 and a whole answer),
  error (an HTTP error answer) or dropped (no HTTP answer: reset, closed, timed out);
* meanwhile ``--slow`` (300) connections each send a partial request head and then one header
  byte a second, never finishing it; when the server closes one, it is opened again, so the
  300 are held for the whole run;
* ``/health`` is asked every 0.2 s throughout; its slowest answer is reported.

    .venv/bin/python -m scripts.bench.serve_load
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from scripts.workloads import CONFIGS, REPO

HOST = "127.0.0.1"  # loopback only


def write_tiny_team(folder: Path) -> Path:
    """The solver-critic-judge team on tiny-random, greedy, 12 new tokens a turn."""
    data = yaml.safe_load((CONFIGS / "solver_critic_judge.yaml").read_text())
    for role in data["roles"]:
        role.pop("adapter", None)
        role["model"] = "tiny-random"
        role["decoding"] = {**role.get("decoding", {}), "max_new_tokens": 12, "temperature": 0.0}
    path = folder / "team.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    slow_opened: int = 0
    slow_closed_by_server: int = 0
    slow_open_now: int = 0
    slow_open_min: int = 10**9  # fewest slow connections open at a probe once clients run
    clients_running: bool = False
    health: list[float] = field(default_factory=list)
    health_failed: int = 0


async def client(http: httpx.AsyncClient, n: int, requests: int, tally: Tally) -> None:
    for k in range(requests):
        body = {
            "model": "solver-critic-judge",
            "stream": k % 2 == 1,
            "messages": [{"role": "user", "content": f"What is {n} + {k}?"}],
        }
        start = time.perf_counter()
        try:
            if body["stream"]:
                async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                    text = (await r.aread()).decode() if r.status_code == 200 else ""
                    ok = r.status_code == 200 and text.rstrip().endswith("data: [DONE]")
            else:
                r = await http.post("/v1/chat/completions", json=body)
                ok = r.status_code == 200 and "choices" in r.json()
        except httpx.HTTPError as exc:
            tally.dropped += 1
            tally.errors[type(exc).__name__] = tally.errors.get(type(exc).__name__, 0) + 1
            continue
        if ok:
            tally.latencies.append(time.perf_counter() - start)
        else:
            key = f"HTTP {r.status_code}"
            tally.errors[key] = tally.errors.get(key, 0) + 1


async def slow_connection(port: int, stop: asyncio.Event, tally: Tally) -> None:
    """A partial request head, one more header byte a second, reopened when closed."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            await asyncio.sleep(0.5)
            continue
        tally.slow_opened += 1
        tally.slow_open_now += 1
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            while not stop.is_set():
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1024), 1.0) == b"":
                        tally.slow_closed_by_server += 1
                        break
                except TimeoutError:
                    writer.write(b"a")
        except OSError:
            tally.slow_closed_by_server += 1
        finally:
            tally.slow_open_now -= 1
            writer.close()


async def probe_health(base: str, stop: asyncio.Event, tally: Tally) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=5) as http:
        while not stop.is_set():
            if tally.clients_running:
                tally.slow_open_min = min(tally.slow_open_min, tally.slow_open_now)
            start = time.perf_counter()
            try:
                ok = (await http.get("/health")).status_code == 200
            except httpx.HTTPError:
                ok = False
            tally.health.append(time.perf_counter() - start)
            tally.health_failed += not ok
            await asyncio.sleep(0.2)


async def load(base: str, port: int, args: argparse.Namespace) -> tuple[Tally, float, str]:
    tally, stop = Tally(), asyncio.Event()
    slow = [asyncio.create_task(slow_connection(port, stop, tally)) for _ in range(args.slow)]
    health = asyncio.create_task(probe_health(base, stop, tally))
    await asyncio.sleep(args.warmup)  # the slow connections are in place before the clients
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    start, tally.clients_running = time.perf_counter(), True
    async with httpx.AsyncClient(base_url=base, timeout=args.timeout, limits=limits) as http:
        try:
            await asyncio.wait_for(
                asyncio.gather(
                    *(client(http, n, args.requests, tally) for n in range(args.clients))
                ),
                args.max_seconds,
            )
        except TimeoutError:
            print(f"stopped after --max-seconds {args.max_seconds}", file=sys.stderr)
        wall = time.perf_counter() - start
        metrics = (await http.get("/metrics")).text
    stop.set()
    await asyncio.gather(*slow, health)
    return tally, wall, metrics


def series(metrics: str, name: str) -> float:
    return sum(
        float(ln.rsplit(" ", 1)[1])
        for ln in metrics.splitlines()
        if ln.startswith(name + " ") or ln.startswith(name + "{")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--requests", type=int, default=2, help="per client, one after another")
    ap.add_argument("--slow", type=int, default=300, help="partial-header connections")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds the slow ones go first")
    ap.add_argument("--timeout", type=float, default=120.0, help="per request, client side")
    ap.add_argument("--max-seconds", type=float, default=300.0, help="for all the clients")
    args = ap.parse_args()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    with tempfile.TemporaryDirectory() as tmp:
        team = write_tiny_team(Path(tmp))
        server = subprocess.Popen(
            [sys.executable, "-m", "marl", "serve", str(team), "--host", HOST, "--port", "0"],
            cwd=REPO,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
        )
        try:
            line = server.stdout.readline()
            if " on http://" not in line:
                sys.exit(f"the server did not start: {line!r}")
            base = line.split(" on ", 1)[1].split(" ", 1)[0].removesuffix("/v1")
            port = int(base.rsplit(":", 1)[1])
            tally, wall, metrics = asyncio.run(load(base, port, args))
        finally:
            server.terminate()
            server.wait(timeout=60)
    lat = sorted(tally.latencies)
    if not lat:
        sys.exit(f"no request was answered: {tally.errors}")
    total = args.clients * args.requests
    p95 = statistics.quantiles(lat, n=20, method="inclusive")[18] if len(lat) >= 2 else lat[0]
    batches = series(metrics, "marl_batch_size_count")
    rows = [
        ("valid requests sent", f"{total} ({args.clients} clients x {args.requests})"),
        ("answered 200", str(len(lat))),
        (
            "errors (HTTP error answers)",
            str(sum(v for k, v in tally.errors.items() if k.startswith("HTTP"))),
        ),
        ("dropped (no HTTP answer)", str(tally.dropped)),
        (
            "latency p50 / p95 / max (s)",
            f"{statistics.median(lat):.2f} / {p95:.2f} / {lat[-1]:.2f}",
        ),
        ("wall time for all clients (s)", f"{wall:.1f}"),
        (
            "team batches (mean size)",
            f"{batches:.0f} ({series(metrics, 'marl_batch_size_sum') / max(batches, 1):.1f})",
        ),
        (
            "slow connections: kept open / opened / closed by server",
            f"{args.slow} / {tally.slow_opened} / {tally.slow_closed_by_server}",
        ),
        ("fewest slow connections open at a probe (clients running)", str(tally.slow_open_min)),
        (
            "/health probes: count / failed / max latency (s)",
            f"{len(tally.health)} / {tally.health_failed} / {max(tally.health):.3f}",
        ),
    ]
    if tally.errors:
        rows.append(("error kinds", ", ".join(f"{k}: {v}" for k, v in tally.errors.items())))
    print("| measurement | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
