"""The server honours a request's sampling parameters on the tiny random model (max_tokens,
n, stop, seed, temperature) and refuses, by name, the parameters it cannot honour."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from helpers import Gate, tiny_chain
from marl.orchestrator.serving.serve import TeamServer, make_server
from marl.orchestrator.team import Team

MODEL = "solver-critic-judge"
QUESTION = "What is 3 + 4?"


@pytest.fixture(scope="module")
def server():
    with make_server(Team.from_config(tiny_chain()), port=0) as srv:
        yield srv


def ask(server: TeamServer, **params: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], **params}
    with httpx.Client(base_url=server.url, timeout=120) as http:
        return http.post("/chat/completions", json=body)


def answer(server: TeamServer, **params: Any) -> dict[str, Any]:
    r = ask(server, **params)
    assert r.status_code == 200, r.text
    return r.json()


def test_max_tokens_bounds_every_turn(server: TeamServer) -> None:
    for key in ("max_tokens", "max_completion_tokens"):
        out = answer(server, **{key: 1})
        turns = out["marl"]["transcript"]
        assert [t["completion_tokens"] for t in turns] == [1, 1, 1]
        assert out["usage"]["completion_tokens"] == 3
        assert out["choices"][0]["finish_reason"] == "length"
    default = answer(server)["marl"]["transcript"]
    assert max(t["completion_tokens"] for t in default) > 1  # the roles' own 12


def test_n_gives_n_choices_and_seed_reproduces(server: TeamServer) -> None:
    sampled = {"temperature": 1.0, "max_tokens": 8}
    two = answer(server, n=2, seed=11, **sampled)
    assert [c["index"] for c in two["choices"]] == [0, 1]
    texts = [c["message"]["content"] for c in two["choices"]]
    # choice i runs with seed + i, alone: the same answers asked one by one
    assert texts == [
        answer(server, seed=s, **sampled)["choices"][0]["message"]["content"] for s in (11, 12)
    ]
    assert answer(server, seed=11, **sampled)["choices"][0]["message"]["content"] == texts[0]
    others = {
        answer(server, seed=s, **sampled)["choices"][0]["message"]["content"] for s in range(4)
    }
    assert len(others) > 1  # the seed matters


def test_stop_cuts_the_answer(server: TeamServer) -> None:
    full = answer(server)["choices"][0]["message"]["content"]
    assert len(full) > 4
    stop = full[3:5]
    out = answer(server, stop=[stop, "never said \u2603"])["choices"][0]
    assert out["message"]["content"] == full[: full.find(stop)]
    assert out["finish_reason"] == "stop"
    assert answer(server, stop=stop)["choices"][0]["message"]["content"] == full[: full.find(stop)]


def test_neutral_values_of_unsupported_parameters_pass(server: TeamServer) -> None:
    out = answer(
        server,
        logprobs=False,
        frequency_penalty=0,
        presence_penalty=0,
        tools=[],
        user="someone",
        temperature=None,
        seed=None,
    )
    assert (
        out["choices"][0]["message"]["content"]
        == answer(server)["choices"][0]["message"]["content"]
    )


@pytest.mark.parametrize(
    "params, param",
    [
        ({"logprobs": True}, "logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"made_up": 1}, "made_up"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2, "max_completion_tokens": 3}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"n": 9}, "n"),
        ({"n": 2, "stream": True}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"seed": -1}, "seed"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_it(
    server: TeamServer, params: dict[str, Any], param: str
) -> None:
    r = ask(server, **params)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_a_team_that_samples_no_model_refuses_sampling_parameters() -> None:
    cfg = tiny_chain()
    team = Team.from_config(cfg, policies={r.name: Gate() for r in cfg.roles})
    with make_server(team, port=0) as srv:
        r = ask(srv, temperature=0.5)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"
    assert "no role of team 'solver-critic-judge' samples" in r.json()["error"]["message"]
