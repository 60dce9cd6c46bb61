"""Hosted roles fail loudly: an endpoint that cannot answer is an error naming its URL and the
cause after bounded retries, never an empty answer; ``marl models check`` probes every role."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marl.agents.openai_backend import EndpointError, OpenAIPolicy
from marl.agents.policy import Request
from marl.cli import app


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Scripted(BaseHTTPRequestHandler):
    """Answers POSTs with the next ``(status, body)`` of ``script``; the last one repeats."""

    script: list[tuple[int, dict]] = []
    calls = 0

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers["Content-Length"]))
        cls = type(self)
        status, body = cls.script[min(cls.calls, len(cls.script) - 1)]
        cls.calls += 1
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def scripted_server() -> Iterator[type[_Scripted]]:
    handler = type("Handler", (_Scripted,), {"script": [], "calls": 0})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def answer(text: str) -> dict:
    return {"choices": [{"message": {"role": "assistant", "content": text}}]}


def test_a_closed_port_is_an_error_naming_the_url_after_the_retries() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    pol = OpenAIPolicy(url, "m", tries=3, backoff=0.01)
    with pytest.raises(EndpointError) as err:
        pol.chat([{"role": "user", "content": "hi"}])
    message = str(err.value)
    assert f"{url}/chat/completions" in message
    assert "after 3 tries" in message and "ConnectError" in message
    assert pol.errors == 3


def test_a_server_error_is_retried_and_the_next_answer_used(scripted_server) -> None:
    scripted_server.script = [(500, {"error": {"message": "overloaded"}}), (200, answer("[Bet]"))]
    pol = OpenAIPolicy(scripted_server.url, "m", backoff=0.01)
    out = pol.act(
        [
            Request(
                messages=[{"role": "user", "content": "hi"}],
                legal=[0, 1],
                action_texts=["[Check]", "[Bet]"],
            )
        ]
    )
    assert out[0].text == "[Bet]"
    assert scripted_server.calls == 2 and pol.errors == 1


def test_a_refused_request_is_not_retried_and_says_why(scripted_server) -> None:
    scripted_server.script = [(401, {"error": {"message": "Incorrect API key provided"}})]
    pol = OpenAIPolicy(scripted_server.url, "m", backoff=0.01)
    with pytest.raises(EndpointError, match=r"HTTP 401: Incorrect API key provided") as err:
        pol.chat([{"role": "user", "content": "hi"}])
    assert scripted_server.url in str(err.value)
    assert scripted_server.calls == 1


def test_rate_limits_are_retried_then_reported(scripted_server) -> None:
    scripted_server.script = [(429, {"error": {"message": "slow down"}})]
    pol = OpenAIPolicy(scripted_server.url, "m", tries=2, backoff=0.01)
    with pytest.raises(EndpointError, match=r"after 2 tries \(HTTP 429: slow down\)"):
        pol.chat([{"role": "user", "content": "hi"}])
    assert scripted_server.calls == 2


def hosted_team(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "hosted.yaml"
    path.write_text(f"""\
schema: marl-teams/v1
name: hosted
roles:
  - name: player
    backend: openai
    model: gpt-4o-mini
    endpoint: {{base_url: "{url}"}}
game: {{name: kuhn_poker}}
""")
    return path


def test_play_with_an_unreachable_hosted_role_exits_2_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    result = CliRunner().invoke(
        app,
        [
            "play",
            str(hosted_team(tmp_path, url)),
            "--against",
            "random",
            "--episodes",
            "1",
            "--out",
            str(tmp_path / "t.jsonl"),
        ],
    )
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and f"{url}/chat/completions" in result.output
    assert "Traceback" not in result.output


def test_team_run_raises_instead_of_answering_empty(tmp_path: Path) -> None:
    from marl.orchestrator.team import Team

    url = f"http://127.0.0.1:{closed_port()}/v1"
    path = tmp_path / "qa.yaml"
    path.write_text(
        hosted_team(tmp_path, url)
        .read_text()
        .replace("game: {name: kuhn_poker}", "game: {name: split_arithmetic}")
    )
    team = Team.from_yaml(path)
    with pytest.raises(EndpointError, match=url):
        team.run("What is 2 + 3?")


def mixed_team(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "mixed.yaml"
    path.write_text(f"""\
schema: marl-teams/v1
name: mixed
roles:
  - {{name: local, model: tiny-random}}
  - {{name: bot, backend: scripted, model: random}}
  - name: hosted
    backend: openai
    model: gpt-4o-mini
    endpoint: {{base_url: "{url}"}}
game: {{name: split_arithmetic}}
""")
    return path


def test_models_check_probes_every_role(tmp_path: Path, scripted_server) -> None:
    scripted_server.script = [(200, answer("ok"))]
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(app, ["models", "check", str(mixed_team(tmp_path, scripted_server.url))])
    assert result.exit_code == 0, result.output
    rows = {
        line.split("│")[1].strip(): line
        for line in result.output.splitlines()
        if line.count("│") > 4
    }
    assert {"local", "bot", "hosted"} <= set(rows)
    assert all(" ok " in rows[r] and " s " in rows[r] for r in ("local", "bot", "hosted"))
    assert scripted_server.calls == 1

    url = f"http://127.0.0.1:{closed_port()}/v1"
    result = runner.invoke(app, ["models", "check", str(mixed_team(tmp_path, url))])
    assert result.exit_code == 2, result.output
    assert f"{url}/chat/completions" in result.output and "ConnectError" in result.output
    assert "error: 1 of 3 roles failed: hosted" in result.output
