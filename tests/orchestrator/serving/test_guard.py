"""The server under hostile clients, on real uvicorn: bodies sent slowly or in part are cut
off (408) while /health still answers; requests beyond the limit get a 503, /health never;
made-up methods do not grow /metrics; content that is not text is a 400; a served game team
says what it is."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from helpers import tiny_chain, tiny_team
from marl.config import load_config_text
from marl.orchestrator.serving.api import Limits
from marl.orchestrator.serving.serve import game_warning, make_server
from marl.orchestrator.team import Team

QUESTION = "What is 3 + 4?"


@pytest.fixture(scope="module")
def team() -> Team:
    return Team.from_config(tiny_chain())


def _status(sock: socket.socket) -> int:
    """The status of the answer on ``sock``, read to the server's close."""
    sock.settimeout(15)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return int(data.split(b" ", 2)[1])


def test_slow_bodies_are_cut_off_and_health_answers(team: Team) -> None:
    limits = Limits(body_timeout_s=2.0, max_requests=3)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
    )
    with make_server(team, port=0, limits=limits) as srv:
        root = srv.url.removesuffix("/v1")
        started = time.monotonic()
        slow = []
        for _ in range(5):
            s = socket.create_connection(srv.server_address[:2])
            s.sendall(head + b'{"messages": [')  # and no more
            slow.append(s)
        time.sleep(0.3)
        with httpx.Client(base_url=root, timeout=10) as http:
            assert http.get("/health").json()["status"] == "ok"  # three held, two refused
            assert time.monotonic() - started < limits.body_timeout_s
            statuses = sorted(_status(s) for s in slow)
            assert statuses == [408, 408, 408, 503, 503]
            for s in slow:
                s.close()
            r = http.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": QUESTION}]}
            )
            assert r.status_code == 200  # the held requests are gone


def test_a_body_that_comes_in_time_in_pieces_is_read(team: Team) -> None:
    limits = Limits(body_timeout_s=5.0)
    body = b'{"messages": [{"role": "user", "content": "What is 3 + 4?"}], "max_tokens": 1}'
    with make_server(team, port=0, limits=limits) as srv:
        s = socket.create_connection(srv.server_address[:2])
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        for i in range(0, len(body), 20):
            s.sendall(body[i : i + 20])
            time.sleep(0.1)
        assert _status(s) == 200
        s.close()


def test_made_up_methods_do_not_grow_the_metrics(team: Team) -> None:
    with make_server(team, port=0) as srv, httpx.Client(timeout=10) as http:
        root = srv.url.removesuffix("/v1")
        for i in range(20):
            assert http.request(f"BREW{i}", f"{root}/v1/models").status_code == 405
            assert http.request(f"BREW{i}", f"{root}/nowhere/{i}").status_code == 404
        text = http.get(f"{root}/metrics").text
    series = [ln for ln in text.splitlines() if ln.startswith("marl_requests_total{")]
    assert not any("BREW" in ln or "nowhere" in ln for ln in series)
    assert 'marl_requests_total{method="OTHER",route="/v1/models",status="405"} 20.0' in series
    assert 'marl_requests_total{method="OTHER",route="other",status="404"} 20.0' in series


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}],
        [{"type": "text", "text": 5}],
        [{"text": "no type"}],
        5,
        {"type": "text", "text": "hi"},
    ],
)
def test_content_that_is_not_text_is_a_400(team: Team, content: object) -> None:
    with make_server(team, port=0) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        r = http.post(
            "/chat/completions", json={"messages": [{"role": "user", "content": content}]}
        )
        ok = http.post(
            "/chat/completions",
            json={
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "max_tokens": 1,
            },
        )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("messages.0.content")
    assert ok.status_code == 200


def test_a_game_team_says_what_it_is(team: Team) -> None:
    train = "  steps: 1\n  ray: {enabled: false}\n"
    poker = Team.from_config(load_config_text(tiny_team("kuhn_poker", train)))
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 2}
    for served, game in ((poker, "kuhn_poker"), (team, None)):
        with make_server(served, port=0) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
            (card,) = http.get("/models").json()["data"]
            r = http.post("/chat/completions", json=body)
        assert r.status_code == 200
        assert card["marl"]["made_for"] == ("game" if game else "task")
        assert card["marl"]["served_as"] == "free-text chat"
        assert r.headers.get("X-Marl-Game-Team") == game
    assert "made to play kuhn_poker" in game_warning(poker)
    assert game_warning(team) is None
