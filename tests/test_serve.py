"""`marl serve`: an OpenAI-compatible server for a team, on loopback, called with the openai
client and with plain HTTP (httpx), streaming and not; requests arriving together batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from agents.policy import Request, Response
from configs import TeamConfig, load_config
from orchestrator.serve import TeamServer, make_server
from orchestrator.team import Team

REPO = Path(__file__).parents[1]


def tiny_chain() -> TeamConfig:
    cfg = load_config(REPO / "configs" / "solver_critic_judge.yaml")
    return cfg.model_copy(update={"roles": [r.model_copy(update={
        "model": "tiny-random", "decoding": r.decoding.model_copy(
            update={"max_new_tokens": 12, "temperature": 0.0})}) for r in cfg.roles]})


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
        messages=[{"role": "system", "content": "ignored by the team"},
                  {"role": "user", "content": "an earlier question"},
                  {"role": "assistant", "content": "an earlier answer"},
                  {"role": "user", "content": QUESTION}])
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
        model="solver-critic-judge", messages=[{"role": "user", "content": QUESTION}],
        stream=True, stream_options={"include_usage": True})
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
        body = {"model": "solver-critic-judge",
                "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}]}
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
        deltas = [json.loads(ln[6:])["choices"][0]["delta"] for ln in lines
                  if ln.startswith("data: {")]
        assert "".join(d.get("content", "") for d in deltas) == answer
        assert http.get("/models").json()["data"][0]["id"] == "solver-critic-judge"
        assert http.get(server.url.removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_errors_in_openai_format(server: TeamServer, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="model 'gpt-4o' is not served here"):
        client.chat.completions.create(model="gpt-4o",
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="no message with role 'user'"):
        client.chat.completions.create(model="solver-critic-judge",
                                       messages=[{"role": "system", "content": "hi"}])
    with httpx.Client(base_url=server.url, timeout=30) as http:
        bad = http.post("/chat/completions", content=b"{not json",
                        headers={"Content-Type": "application/json"})
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        assert http.post("/completions", json={}).status_code == 404
        assert http.get("/nothing").json()["error"]["code"] == "not_found"


class Gate:
    """A policy that holds its calls until released, and records each batch's questions."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []

    def act(self, requests: list[Request]) -> list[Response]:
        self.entered.set()
        self.release.wait(30)
        self.batches.append([r.messages[-1]["content"].split("\n", 1)[0] for r in requests])
        return [Response(text=f"answer {len(self.batches)}") for _ in requests]


def test_concurrent_requests_are_batched() -> None:
    gate = Gate()
    cfg = tiny_chain()
    team = Team.from_config(cfg, policies={r.name: gate for r in cfg.roles})
    with make_server(team, port=0) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="x", max_retries=0, timeout=60)
        answers: dict[str, str] = {}

        def ask(q: str) -> None:
            r = c.chat.completions.create(model="solver-critic-judge",
                                          messages=[{"role": "user", "content": q}])
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
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", str(folder),
                             "--port", "0"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving team 'solver-critic-judge' on http://127.0.0.1:" in line, (
            line + proc.stderr.read() if proc.poll() is not None else line)
        url = line.split(" on ", 1)[1].split(" ", 1)[0]
        c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        full = c.chat.completions.create(model="solver-critic-judge",
                                         messages=[{"role": "user", "content": QUESTION}])
        streamed = "".join(ch.choices[0].delta.content or "" for ch in
                           c.chat.completions.create(
                               model="solver-critic-judge", stream=True,
                               messages=[{"role": "user", "content": QUESTION}])
                           if ch.choices)
        assert streamed == full.choices[0].message.content
        expected = Team.load(folder).run(QUESTION).answer
        assert full.choices[0].message.content == expected
    finally:
        proc.terminate()
        proc.wait(timeout=30)
