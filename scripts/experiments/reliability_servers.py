"""Reliability probes of weights and of the server: damaged adapter files wherever weights are
read, and clients that misbehave against ``marl serve``."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from scripts.experiments.reliability_core import REPO, Outcome, case, copy_run

ADAPTER = "run/checkpoints/step_000002/adapters/player/adapter_model.safetensors"


def _rewrite(path: Path, change: Callable[[dict], dict]) -> None:
    save_file(change(load_file(path)), path)


def _reshape(tensors: dict) -> dict:
    name = sorted(tensors)[0]
    return {**tensors, name: torch.zeros(tensors[name].shape[0] + 1, 3)}


WEIGHT_DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "wrong shape": lambda p: _rewrite(p, _reshape),
    "tensor missing": lambda p: _rewrite(p, lambda t: dict(sorted(t.items())[1:])),
    "int8 tensors": lambda p: _rewrite(p, lambda t: {k: v.to(torch.int8) for k, v in t.items()}),
    "NaN weights": lambda p: _rewrite(p, lambda t: {k: v * float("nan") for k, v in t.items()}),
}

WEIGHT_COMMANDS = {
    "resume": ["train", "team.yaml", "--out", "run", "--resume", "--steps", "3"],
    "eval": ["eval", "exploitability", "run"],
    "export": ["export", "run", "--out", "exported"],
    "serve": ["serve", "run", "--port", "0"],
}


def weights_family(base: Path, _: int) -> Iterator[Outcome]:
    """A damaged adapter file: a located error wherever it is read, the run unchanged."""
    for damage_name, damage in WEIGHT_DAMAGE.items():
        for command, args in WEIGHT_COMMANDS.items():
            folder = copy_run(base, f"{damage_name}-{command}".replace(" ", "-"))
            damage(folder / ADAPTER)
            yield case(
                "damaged weights",
                f"{damage_name} in {command}",
                folder,
                *args,
                keep=folder / "run",
                forbidden=folder / "exported",
                timeout=90,
            )


def _serve(folder: Path) -> tuple[subprocess.Popen, int]:
    """``marl serve`` of the trained run on a free port, once it answers."""
    env = {**os.environ, "PYTHONPATH": f"{folder}{os.pathsep}{REPO}"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "marl", "serve", "run", "--port", str(port)],
        cwd=folder,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _get(port, "/health") is None:
        time.sleep(1)
    return proc, port


def _get(
    port: int, path: str, method: str = "GET", timeout: float = 5, body: str = ""
) -> str | None:
    """The raw HTTP response to a request (a JSON ``body`` if given), or None when there is
    none in time."""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body.encode())}\r\n"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(f"{head}\r\n{body}".encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


def _slow_clients(port: int, count: int) -> list[socket.socket]:
    """Clients that announce a body and send a byte of it."""
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 1000\r\n\r\n{"
    )
    socks = []
    for _ in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(head.encode())
        socks.append(s)
    return socks


def _closed(sock: socket.socket) -> bool:
    """The server has closed the connection or answered it (408: the body came too slowly)."""
    sock.settimeout(0.1)
    try:
        data = sock.recv(64)
        return data == b"" or data.startswith(b"HTTP/1.1 408")
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def server_family(base: Path, _: int) -> Iterator[Outcome]:
    """Slow bodies, made-up methods and odd content parts against a served team."""
    proc, port = _serve(copy_run(base, "served"))
    try:
        if _get(port, "/health") is None:
            yield Outcome("server", "start", "wrong", "marl serve did not answer /health")
            return
        socks = _slow_clients(port, 300)
        health = _get(port, "/health", timeout=10)
        yield Outcome("server", "/health beside 300 slow bodies", _ok(health, "200"), "")
        time.sleep(45)
        open_ = sum(not _closed(s) for s in socks)
        for s in socks:
            s.close()
        yield Outcome("server", "slow bodies cut off", "ok" if open_ == 0 else "wrong", f"{open_}")
        yield _made_up_methods(port)
        yield from _odd_content(port)
    finally:
        proc.kill()
        proc.wait()


def _made_up_methods(port: int) -> Outcome:
    """Requests with invented methods and paths must not grow /metrics with their number:
    after the first few (one label set for all of them), 200 more add no series."""
    for i in range(5):
        _get(port, f"/warm{i}", method=f"WARM{i}")
    _get(port, "/metrics")  # its own series exist before counting
    before = _series(_get(port, "/metrics") or "")
    for i in range(200):
        _get(port, f"/x{i}", method=f"FOO{i}")
    grown = _series(_get(port, "/metrics") or "") - before
    verdict = "ok" if grown == 0 else "wrong"
    return Outcome("server", "200 made-up methods and paths", verdict, f"{grown} new series")


ODD_CONTENT = {
    "an image part": [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}],
    "a number": 5,
    "a list of numbers": [1, 2],
    "a part without text": [{"type": "text"}],
}


def _odd_content(port: int) -> Iterator[Outcome]:
    """Messages whose content is not text: a 400 naming the problem, never a 500."""
    for name, content in ODD_CONTENT.items():
        body = json.dumps({"messages": [{"role": "user", "content": content}]})
        response = _get(port, "/v1/chat/completions", "POST", timeout=60, body=body)
        first = (response or "").split("\r\n", 1)[0]
        yield Outcome("server", f"content as {name}", _ok(response, "400"), first)


def _series(text: str) -> int:
    return len([ln for ln in text.splitlines() if ln and not ln.startswith("#")])


def _ok(response: str | None, status: str) -> str:
    if response is None:
        return "hung"
    first = response.split("\r\n", 1)[0]
    return "ok" if re.search(rf"\b{status}\b", first) else "wrong"
