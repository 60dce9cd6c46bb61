"""`marl serve`: an OpenAI-compatible server for a team, on loopback, called with the openai
client and with plain HTTP (httpx), streaming and not; requests arriving together batch; bad
requests get a 4xx in OpenAI's format and fail alone; limits, metrics, docs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from helpers import Gate, tiny_chain
from marl.agents.policy import Request, Response
from marl.orchestrator.serving.api import Limits
from marl.orchestrator.serving.serve import TeamServer, make_server
from marl.orchestrator.team import Team

REPO = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def team() -> Team:
    return Team.from_config(tiny_chain())


@pytest.fixture(scope="module")
def server(team: Team):
    with make_server(team, port=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: TeamServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


QUESTION = "What is 3 + 4?"


def test_binds_loopback_by_default(server: TeamServer) -> None:
    assert server.server_address[0] == "127.0.0.1"
    assert server.url.startswith("http://127.0.0.1:")


def test_models(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["solver-critic-judge"]
    assert client.models.retrieve("solver-critic-judge").owned_by == "marl-teams"


def test_chat_completion_with_the_openai_client(client: openai.OpenAI, team: Team) -> None:
    resp = client.chat.completions.create(
        model="solver-critic-judge",
        messages=[
            {"role": "system", "content": "ignored by the team"},
            {"role": "user", "content": "an earlier question"},
            {"role": "assistant", "content": "an earlier answer"},
            {"role": "user", "content": QUESTION},
        ],
    )
    expected = team.run(QUESTION)
    assert resp.object == "chat.completion" and resp.model == "solver-critic-judge"
    (choice,) = resp.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert choice.message.content == expected.answer
    assert resp.usage.total_tokens == expected.tokens > 0
    extra = resp.model_extra["marl"]
    assert extra["messages"] == 2 and extra["decided_by"] == "judge@0"
    assert [t["agent"] for t in extra["transcript"]] == ["solver", "critic", "judge"]


def test_streaming_with_the_openai_client(client: openai.OpenAI, team: Team) -> None:
    stream = client.chat.completions.create(
        model="solver-critic-judge",
        messages=[{"role": "user", "content": QUESTION}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == team.run(QUESTION).answer
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop" and set(finish[:-1]) == {None}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


def test_plain_http_and_sse(server: TeamServer, team: Team) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        body = {
            "model": "solver-critic-judge",
            "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        }
        r = http.post("/chat/completions", json=body)
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        answer = r.json()["choices"][0]["message"]["content"]
        assert answer == team.run(QUESTION).answer
        with http.stream("POST", "/chat/completions", json={**body, "stream": True}) as s:
            assert s.headers["content-type"] == "text/event-stream"
            lines = [ln for ln in s.iter_lines() if ln]
        comments = [ln for ln in lines if ln.startswith(":")]
        assert comments == [": solver@0 done", ": critic@0 done", ": judge@0 done"]
        assert lines[-1] == "data: [DONE]"
        deltas = [
            json.loads(ln[6:])["choices"][0]["delta"] for ln in lines if ln.startswith("data: {")
        ]
        assert "".join(d.get("content", "") for d in deltas) == answer
        assert http.get("/models").json()["data"][0]["id"] == "solver-critic-judge"
        assert http.get(server.url.removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_errors_in_openai_format(server: TeamServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4o' is not served here"):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="no message with role 'user'"):
        client.chat.completions.create(
            model="solver-critic-judge", messages=[{"role": "system", "content": "hi"}]
        )
    with httpx.Client(base_url=server.url, timeout=30) as http:
        bad = http.post(
            "/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        assert http.post("/completions", json={}).status_code == 404
        assert http.get("/nothing").json()["error"]["code"] == "not_found"


def test_concurrent_requests_are_batched() -> None:
    gate = Gate()
    cfg = tiny_chain()
    team = Team.from_config(cfg, policies={r.name: gate for r in cfg.roles})
    with make_server(team, port=0) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        answers: dict[str, str] = {}

        def ask(q: str) -> None:
            r = c.chat.completions.create(
                model="solver-critic-judge", messages=[{"role": "user", "content": q}]
            )
            answers[q] = r.choices[0].message.content

        threads = [threading.Thread(target=ask, args=(q,)) for q in ("q1", "q2", "q3")]
        threads[0].start()
        assert gate.entered.wait(30)  # q1 is inside the team, held at the gate
        for t in threads[1:]:
            t.start()
        deadline = time.time() + 30
        while srv.batcher.queue.qsize() < 2 and time.time() < deadline:
            time.sleep(0.01)
        gate.release.set()
        for t in threads:
            t.join(30)
    assert set(answers) == {"q1", "q2", "q3"}
    # q1 alone (solver, critic, judge), then q2 and q3 together (in arrival order, which the
    # threads decide), one call per generation
    assert [sorted(b) for b in gate.batches] == [["q1"]] * 3 + [["q2", "q3"]] * 3
    assert gate.batches[3] == gate.batches[4] == gate.batches[5]


def test_api_key_is_required_when_set(team: Team) -> None:
    with make_server(team, port=0, api_key="s3cret") as srv:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url, api_key="wrong", max_retries=0).models.list()
        ok = openai.OpenAI(base_url=srv.url, api_key="s3cret", max_retries=0)
        assert [m.id for m in ok.models.list()] == ["solver-critic-judge"]


def test_marl_serve_cli_on_loopback(tmp_path: Path) -> None:
    folder = tmp_path / "team"
    folder.mkdir()
    data = tiny_chain().model_dump(by_alias=True, mode="json", exclude_none=True)
    for role in data["roles"]:
        role.pop("adapter", None)  # an untrained team folder: frozen roles, no adapters
    (folder / "team.yaml").write_text(yaml.safe_dump(data))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "marl", "serve", str(folder), "--port", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "serving team 'solver-critic-judge' on http://127.0.0.1:" in line, (
            line + proc.stderr.read() if proc.poll() is not None else line
        )
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        full = c.chat.completions.create(
            model="solver-critic-judge", messages=[{"role": "user", "content": QUESTION}]
        )
        streamed = "".join(
            ch.choices[0].delta.content or ""
            for ch in c.chat.completions.create(
                model="solver-critic-judge",
                stream=True,
                messages=[{"role": "user", "content": QUESTION}],
            )
            if ch.choices
        )
        assert streamed == full.choices[0].message.content
        expected = Team.load(folder).run(QUESTION).answer
        assert full.choices[0].message.content == expected
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _error(r: httpx.Response, status: int) -> str:
    """The message of an OpenAI-format error answer with this status."""
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str)
    return err["message"]


def test_malformed_requests_get_a_4xx_in_openai_format(team: Team) -> None:
    ok = {"model": "solver-critic-judge", "messages": [{"role": "user", "content": QUESTION}]}
    json_bad = [
        b"{not json",
        b"",
        b"[]",
        b"null",
        b'"text"',
        b"{}",
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate
        b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',  # not UTF-8
        b'{"messages": [{"role": "user", "content": "x"}]' + b" " * 3000 + b"x",
    ]
    bodies = [
        {"messages": "hi"},
        {"messages": []},
        {"messages": [{"content": "x"}]},
        {"messages": [{"role": 1, "content": "x"}]},
        {"messages": [{"role": "user", "content": 5}]},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "assistant", "content": "x"}]},
        {**ok, "stream": "yes"},
        {**ok, "model": 5},
        {**ok, "stream_options": {"include_usage": "maybe"}},
        {"messages": [{"role": "user", "content": "x" * 3000}]},
        {"messages": [{"role": "user", "content": "x"}] * 9},
    ]
    limits = Limits(max_body_bytes=8192, max_messages=8, max_task_chars=2000)
    with (
        make_server(team, port=0, limits=limits) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as http,
    ):
        for raw in json_bad:
            _error(
                http.post(
                    "/chat/completions", content=raw, headers={"Content-Type": "application/json"}
                ),
                400,
            )
        for body in bodies:
            _error(http.post("/chat/completions", json=body), 400)
        assert "not valid Unicode: surrogates not allowed" in _error(
            http.post(
                "/chat/completions",
                content=json_bad[6],
                headers={"Content-Type": "application/json"},
            ),
            400,
        )
        assert "over 8192 bytes" in _error(
            http.post(
                "/chat/completions",
                content=b"{" + b" " * 20000 + b"}",
                headers={"Content-Type": "application/json"},
            ),
            413,
        )
        assert "over 8192 bytes" in _error(
            http.post(  # no Content-Length: counted as it comes
                "/chat/completions",
                content=iter([b"{", b" " * 9000, b"}"]),
                headers={"Content-Type": "application/json"},
            ),
            413,
        )
        _error(
            http.post(
                "/chat/completions",
                content=json.dumps(ok).encode(),
                headers={"Content-Type": "text/plain"},
            ),
            400,
        )
        assert http.get("/chat/completions").status_code == 405
        r = http.post("/chat/completions", json=ok)  # and the server still answers
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]


class Picky:
    """A policy that fails on some questions, the way a tokenizer fails on text it rejects."""

    def __init__(self) -> None:
        self.gate = Gate()

    def act(self, requests: list[Request]) -> list[Response]:
        for r in requests:
            if "surrogate" in r.messages[-1]["content"]:
                raise UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
            if "boom" in r.messages[-1]["content"]:
                raise RuntimeError("boom")
        return self.gate.act(requests)


def test_one_bad_request_in_a_batch_fails_alone() -> None:
    picky = Picky()
    cfg = tiny_chain()
    team = Team.from_config(cfg, policies={r.name: picky for r in cfg.roles})
    with make_server(team, port=0) as srv:
        replies: dict[str, httpx.Response] = {}

        def ask(q: str) -> None:
            with httpx.Client(base_url=srv.url, timeout=60) as http:
                replies[q] = http.post(
                    "/chat/completions", json={"messages": [{"role": "user", "content": q}]}
                )

        first = threading.Thread(target=ask, args=("q1",))
        first.start()
        assert picky.gate.entered.wait(30)
        rest = [threading.Thread(target=ask, args=(q,)) for q in ("q2", "boom", "surrogate")]
        for t in rest:
            t.start()
        deadline = time.time() + 30
        while srv.batcher.queue.qsize() < 3 and time.time() < deadline:
            time.sleep(0.01)
        picky.gate.release.set()
        for t in [first, *rest]:
            t.join(30)
    assert replies["q1"].status_code == replies["q2"].status_code == 200
    assert "the team failed: boom" in _error(replies["boom"], 500)
    assert "cannot read this input" in _error(replies["surrogate"], 400)
    # q2, boom and surrogate came as one batch; it failed, so each ran again on its own
    assert [sorted(b) for b in picky.gate.batches] == [["q1"]] * 3 + [["q2"]] * 3


class Stepper:
    """A policy that says one turn per ``step.release()``."""

    def __init__(self) -> None:
        self.step = threading.Semaphore(0)

    def act(self, requests: list[Request]) -> list[Response]:
        assert self.step.acquire(timeout=30)
        return [Response(text="said") for _ in requests]


def test_streaming_sends_each_turn_as_it_finishes() -> None:
    stepper = Stepper()
    cfg = tiny_chain()
    team = Team.from_config(cfg, policies={r.name: stepper for r in cfg.roles})
    body = {"messages": [{"role": "user", "content": QUESTION}], "stream": True}
    with make_server(team, port=0) as srv, httpx.Client(base_url=srv.url, timeout=10) as http:
        with http.stream("POST", "/chat/completions", json=body) as s:
            chunks = (json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {"))
            assert next(chunks)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            for node in ("solver@0", "critic@0", "judge@0"):
                stepper.step.release()  # the next agent may speak; nothing else will come
                turn = next(chunks)
                assert turn["marl"]["turn"]["node"] == node
                assert turn["choices"][0]["delta"] == {"reasoning_content": f"{node}: said\n\n"}
                assert turn["choices"][0]["finish_reason"] is None
            rest = list(chunks)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in rest) == "said"
        assert rest[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_client_leaving_mid_stream_prints_nothing(capfd: pytest.CaptureFixture) -> None:
    stepper = Stepper()
    cfg = tiny_chain()
    team = Team.from_config(cfg, policies={r.name: stepper for r in cfg.roles})
    body = {"messages": [{"role": "user", "content": QUESTION}], "stream": True}
    with make_server(team, port=0) as srv, httpx.Client(base_url=srv.url, timeout=10) as http:
        with http.stream("POST", "/chat/completions", json=body) as s:
            next(s.iter_lines())
        for _ in range(6):  # the team finishes for the client that has gone, then the next
            stepper.step.release()
        assert http.post("/chat/completions", json={**body, "stream": False}).status_code == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Error" not in err


def test_limits_queue_timeout_and_slow_headers(team: Team) -> None:
    gate = Gate()
    cfg = tiny_chain()
    held = Team.from_config(cfg, policies={r.name: gate for r in cfg.roles})
    limits = Limits(max_queue=1, request_timeout_s=1.0, header_timeout_s=0.5)
    body = {"messages": [{"role": "user", "content": QUESTION}]}
    with (
        make_server(held, port=0, limits=limits) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as http,
    ):
        slow = socket.create_connection(srv.server_address[:2])
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # and no more
        replies: list[httpx.Response] = []
        first = threading.Thread(
            target=lambda: replies.append(http.post("/chat/completions", json=body))
        )
        first.start()
        assert gate.entered.wait(30)
        assert "try again later" in _error(http.post("/chat/completions", json=body), 429)
        first.join(30)
        assert "did not answer in time" in _error(replies[0], 504)
        slow.settimeout(5)
        assert slow.recv(100) == b""  # closed by the server, no request head in time
        slow.close()
        assert http.get(srv.url.removesuffix("/v1") + "/health").status_code == 200
        gate.release.set()


def _metric(text: str, series: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(series + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_metrics_count_requests_tokens_and_batches(team: Team) -> None:
    body = {"messages": [{"role": "user", "content": QUESTION}]}
    with make_server(team, port=0) as srv, httpx.Client(base_url=srv.url, timeout=60) as http:
        for _ in range(2):
            assert http.post("/chat/completions", json=body).status_code == 200
        assert http.post("/chat/completions", json={"messages": []}).status_code == 400
        r = http.get(srv.url.removesuffix("/v1") + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    route = 'method="POST",route="/v1/chat/completions"'
    assert _metric(r.text, f'marl_requests_total{{{route},status="200"}}') == 2
    assert _metric(r.text, f'marl_requests_total{{{route},status="400"}}') == 1
    assert _metric(r.text, 'marl_request_duration_seconds_count{route="/v1/chat/completions"}') == 3
    assert _metric(r.text, 'marl_tokens_total{kind="completion"}') > 0
    assert _metric(r.text, "marl_batch_size_count") == 2
    assert _metric(r.text, "marl_pending_requests") == 0


def test_api_key_is_compared_in_constant_time_and_docs_answer(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hmac

    compared: list[bytes] = []
    real = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append(a) or real(a, b))
    root = None
    with make_server(team, port=0, api_key="s3cret") as srv:
        root = srv.url.removesuffix("/v1")
        with httpx.Client(base_url=root, timeout=30) as http:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "Bearer s3cret2"},
                {"Authorization": "s3cret"},
            ):
                assert "API key" in _error(http.get("/v1/models", headers=headers), 401)
                _error(http.post("/v1/chat/completions", headers=headers, content=b"{bad"), 401)
            assert _error(http.get("/health"), 401)
            good = {"Authorization": "Bearer s3cret"}
            assert http.get("/health", headers=good).json()["status"] == "ok"
            assert http.get("/metrics", headers=good).status_code == 200
            docs = http.get("/docs")  # the API's schema needs no key
            assert docs.status_code == 200 and "swagger" in docs.text.lower()
            schema = http.get("/openapi.json").json()
            assert "/v1/chat/completions" in schema["paths"]
    assert b"Bearer wrong" in compared
