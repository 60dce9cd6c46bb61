"""Policies, decoding modes, adapters and the rollout engine on the tiny random model."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from marl import games
from marl.agents import Agent
from marl.agents.builder import build_roster
from marl.agents.hf_policy import HFPolicy
from marl.agents.host import ModelHost
from marl.agents.host.prefill import head_clusters
from marl.agents.host.prompts import CUT
from marl.agents.models import build_tiny_random
from marl.agents.openai_backend import EndpointError, OpenAIPolicy
from marl.agents.participants import ParticipantLoader
from marl.agents.policy import Request, Response, greedy, scale_temperature
from marl.agents.rollout import RolloutEngine
from marl.agents.scripted import ScriptedPolicy
from marl.config import load_config
from marl.orchestrator.arena.play import play

TINY = Path(__file__).parents[2] / "configs" / "tiny_test.yaml"


@pytest.fixture()
def host() -> ModelHost:
    model, tok = build_tiny_random()
    h = ModelHost(model, tok)
    h.add_adapter("red")
    h.add_adapter("blue")
    return h


def kuhn_request(agent_id: str = "player_0", seed: int = 0) -> Request:
    env = games.make("kuhn_poker")
    env.reset(seed=seed)
    return Agent("x", "player", policy=None, mode="choice").request(env, agent_id)  # type: ignore[arg-type]


def test_choice_logprob_matches_separate_forward(host: ModelHost) -> None:
    pol = HFPolicy(host, "red", mode="choice", seed=1)
    reqs = [kuhn_request(seed=s) for s in range(4)]
    for req, resp in zip(reqs, pol.act(reqs), strict=True):
        assert resp.choice is not None and resp.text == req.action_texts[resp.choice]
        with host.use("red"), torch.no_grad():
            per = host.sequence_logprobs(
                [resp.prompt_ids] * len(resp.candidate_ids), resp.candidate_ids
            )
        logpi = torch.log_softmax(torch.stack([p.sum() for p in per]), 0)
        assert abs(float(logpi[resp.choice]) - resp.logprobs[0]) < 1e-4


def test_free_logprobs_match_separate_forward(host: ModelHost) -> None:
    pol = HFPolicy(host, "blue", mode="free", max_new_tokens=12, temperature=0.8, seed=3)
    reqs = [kuhn_request(seed=s) for s in range(3)]  # different prompts: left padding in play
    for resp in pol.act(reqs):
        assert len(resp.completion_ids) == len(resp.logprobs) > 0
        with host.use("blue"), torch.no_grad():
            ref = host.sequence_logprobs([resp.prompt_ids], [resp.completion_ids], temperature=0.8)[
                0
            ]
        assert torch.allclose(ref, torch.tensor(resp.logprobs), atol=1e-4)


def test_responses_and_turns_carry_the_temperature_they_were_sampled_at(host: ModelHost) -> None:
    """A learner rescores a decision at the temperature its response records; greedy
    decoding (T = 0) reports and rescores its log-probs at T = 1."""
    assert greedy(0.0) and not greedy(0.5)
    assert scale_temperature(0.0) == 1.0 and scale_temperature(0.7) == 0.7
    reqs = [kuhn_request(seed=s) for s in range(2)]
    free = HFPolicy(host, "blue", mode="free", max_new_tokens=6, temperature=0)
    for resp in free.act(reqs):
        assert resp.temperature == 0
        with host.use("blue"), torch.no_grad():
            ref = host.sequence_logprobs(
                [resp.prompt_ids], [resp.completion_ids], temperature=resp.temperature
            )[0]
        assert torch.allclose(ref, torch.tensor(resp.logprobs), atol=1e-4)
    hot = HFPolicy(host, "red", mode="choice", temperature=2.5, seed=0)
    assert [r.temperature for r in hot.act(reqs)] == [2.5, 2.5]
    bot = Agent("bot", "bot", ScriptedPolicy("kuhn_poker", "random", seed=0), mode="choice")
    model = Agent("m", "player", hot, mode="choice")
    (ep,) = RolloutEngine(
        lambda: games.make("kuhn_poker"), lambda i: {"player_0": model, "player_1": bot}
    ).play(1)
    assert {(t.name, t.temperature) for t in ep.turns} >= {("m", 2.5)}
    assert all(t.temperature == (2.5 if t.name == "m" else 1.0) for t in ep.turns)


def test_adapter_switching_changes_only_that_role(host: ModelHost) -> None:
    req = kuhn_request()
    pa = HFPolicy(host, "red", mode="choice", temperature=0)
    pb = HFPolicy(host, "blue", mode="choice", temperature=0)
    before_a, before_b = pa.act([req])[0].logprobs, pb.act([req])[0].logprobs
    assert before_a == pytest.approx(before_b)  # fresh LoRA (B = 0) equals the base
    with torch.no_grad():
        for name, p in host.model.named_parameters():
            if "lora_B" in name and ".blue." in name:
                p.normal_(0, 0.5)
    assert pa.act([req])[0].logprobs == pytest.approx(before_a)
    assert pb.act([req])[0].logprobs != pytest.approx(before_b)


def test_adapter_save_load_roundtrip(host: ModelHost, tmp_path: Path) -> None:
    with torch.no_grad():
        for name, p in host.model.named_parameters():
            if "lora_B" in name and ".red." in name:
                p.normal_(0, 0.5)
    host.save_adapter("red", tmp_path / "ad")
    assert (tmp_path / "ad" / "adapter_model.safetensors").is_file()
    other = ModelHost(*build_tiny_random())
    other.load_adapter("copy", tmp_path / "ad")
    req = kuhn_request()
    lp = HFPolicy(host, "red", mode="choice", temperature=0).act([req])[0].logprobs
    lp2 = HFPolicy(other, "copy", mode="choice", temperature=0).act([req])[0].logprobs
    assert lp == pytest.approx(lp2, abs=1e-5)


@pytest.mark.parametrize("first", [True, False])
def test_a_damaged_adapter_is_refused_by_file_and_tensor(
    host: ModelHost, tmp_path: Path, first: bool
) -> None:
    from safetensors.torch import load_file, save_file

    from marl.agents.host.adapters import AdapterMismatch

    host.save_adapter("red", tmp_path / "ad")
    file = tmp_path / "ad" / "adapter_model.safetensors"
    good = load_file(str(file))
    name = sorted(good)[-1]
    save_file({**good, name: good[name][:-1]}, str(file))
    # a new name is attached, refused and removed again, the host's first adapter or not
    other = ModelHost(*build_tiny_random()) if first else host
    before = list(other.adapters)
    with pytest.raises(AdapterMismatch, match=f"{file}: tensor {name} has shape"):
        other.load_adapter("copy", tmp_path / "ad")
    assert other.adapters == before
    save_file(good, str(file))
    other.load_adapter("copy", tmp_path / "ad")  # the repaired file loads under that name
    assert "copy" in other.adapters


class Garbage:
    """A policy whose text never names a move: the malformed-model-output case."""

    def act(self, requests: list[Request]) -> list[Response]:
        return [Response(text="I refuse \\boxed{banana} [[[") for _ in requests]


def test_malformed_output_is_counted_not_raised() -> None:
    seats = games.make("tic_tac_toe").possible_agents
    bad = Agent("bad", "player", Garbage())
    bot = Agent("bot", "bot", ScriptedPolicy("tic_tac_toe", "random", seed=0), mode="choice")
    engine = RolloutEngine(
        lambda: games.make("tic_tac_toe", max_retries=1),
        lambda i: dict(zip(seats, [bad, bot] if i % 2 else [bot, bad], strict=True)),
        concurrency=4,
    )
    eps = engine.play(6)
    for ep in eps:
        bad_seat = next(s for s, n in ep.seats.items() if n == "bad")
        assert ep.illegal_moves[bad_seat] == 2  # one warned retry, then the forfeit
        assert ep.forfeits == [bad_seat]
        assert ep.returns[bad_seat] == -1
        assert all(not t.parsed for t in ep.turns if t.name == "bad")


def test_engine_is_reproducible_and_batches_across_games() -> None:
    cfg = load_config(TINY)

    def run() -> list:
        roster = build_roster(cfg, seed=5)
        calls: list[int] = []
        pol = roster.policies["player"]
        act = pol.act
        pol.act = lambda reqs: calls.append(len(reqs)) or act(reqs)  # type: ignore[method-assign]
        eps = RolloutEngine(
            lambda: games.make("kuhn_poker"),
            lambda i: dict(zip(["player_0", "player_1"], roster.agents, strict=True)),
            concurrency=8,
        ).play(8, seed=3)
        return [(e.returns, [t.action for t in e.turns]) for e in eps], calls

    a, calls = run()
    b, _ = run()
    assert a == b
    assert calls[0] == 8  # the first decision of all 8 games went out as one batch


def test_build_roster_shares_one_base_across_roles(tmp_path: Path) -> None:
    text = TINY.read_text().replace(
        "roles:\n",
        "roles:\n  - name: critic\n    model: tiny-random\n    adapter: {r: 4}\n"
        "    share_base_with: player\n",
    )
    (tmp_path / "t.yaml").write_text(text)
    roster = build_roster(load_config(tmp_path / "t.yaml"))
    assert len(roster.hosts) == 1
    host = next(iter(roster.hosts.values()))
    assert sorted(host.adapters) == ["critic", "player"]
    assert [a.name for a in roster.agents] == ["critic", "player_0", "player_1"]
    assert "critic" in roster.agents[0].system_prompt


def test_play_against_checkpoint_and_bot(tmp_path: Path) -> None:
    cfg = load_config(TINY)
    roster = build_roster(cfg)
    ckpt = tmp_path / "ckpt"
    next(iter(roster.hosts.values())).save_adapter("player", ckpt / "adapters" / "player")
    (ckpt / "team.yaml").write_text(TINY.read_text())
    loader = ParticipantLoader("kuhn_poker", hosts=roster.hosts)
    opp = loader.load(str(ckpt))
    assert len(roster.hosts) == 1  # the checkpoint joined the team's base model
    report = play(roster, "kuhn_poker", {}, 6, [opp], transcripts=tmp_path / "t.jsonl")
    assert report.episodes == 6 and report.parse_errors == 0
    assert {n for n, _ in report.records} == {"player_0", "ckpt"}
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert len(lines) == 6 and "turns" in json.loads(lines[0])
    bot = loader.load("bot:optimal")
    assert play(roster, "kuhn_poker", {}, 4, [bot]).episodes == 4
    with pytest.raises(ValueError, match="neither a bot"):
        loader.load("no-such-thing")


class _ChatServer(BaseHTTPRequestHandler):
    """A loopback OpenAI-compatible endpoint answering from the tiny model."""

    model = tokenizer = None
    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server API)
        from marl.agents.models import generate

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append({"auth": self.headers.get("Authorization"), **body})
        text = generate(
            self.model, self.tokenizer, body["messages"], max_new_tokens=4, temperature=0.0
        )
        if body["messages"][-1]["content"].startswith("Player"):
            text += " [Bet]"
        payload = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args) -> None:
        pass


def test_openai_backend_against_loopback_server(monkeypatch: pytest.MonkeyPatch) -> None:
    _ChatServer.model, _ChatServer.tokenizer = build_tiny_random()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TEST_KEY", "sk-test")
    try:
        pol = OpenAIPolicy(
            f"http://127.0.0.1:{server.server_port}/v1",
            "tiny",
            api_key_env="TEST_KEY",
            max_new_tokens=4,
        )
        reqs = [kuhn_request(seed=s) for s in range(3)]
        out = pol.act(reqs)
        assert len(out) == 3 and pol.errors == 0
        assert _ChatServer.seen[0]["auth"] == "Bearer sk-test"
        assert _ChatServer.seen[0]["model"] == "tiny"
        dead = OpenAIPolicy("http://127.0.0.1:9/v1", "tiny", timeout=2, tries=1)
        with pytest.raises(EndpointError, match="127.0.0.1:9/v1"):  # never an empty answer
            dead.act(reqs[:1])
        assert dead.errors == 1
    finally:
        server.shutdown()


def test_nested_adapter_blocks_score_with_the_adapter_named(host: ModelHost) -> None:
    """PEFT's set_adapter is skipped when the adapter asked for is already set, so every way
    of entering and leaving blocks (the base or another adapter inside an adapter, after
    adapters were added or deleted) must leave the named adapter scoring."""
    req = kuhn_request()
    prompts, cands = (
        [host.prompt_ids(req.messages)[0]],
        [[host.text_ids(t) for t in req.action_texts]],
    )
    with torch.no_grad():
        for name, p in host.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5 if ".red." in name else 0.9)

    def score() -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([lp.sum() for lp in host.sequence_logprobs(prompts * 2, cands[0])])

    with host.use("red"):
        red = score()
    with host.use(None):
        base = score()
    with host.use("blue"):
        blue = score()
    assert not torch.allclose(red, blue) and not torch.allclose(red, base)
    with host.use("red"):
        with host.use(None):
            assert torch.allclose(score(), base)
        assert torch.allclose(score(), red)
        with host.use("blue"):
            assert torch.allclose(score(), blue)
        assert torch.allclose(score(), red)
    with host.use("red"):  # an adapter inside the base model's block, the base after it
        with host.use(None):
            with host.use("blue"):
                assert torch.allclose(score(), blue)
            assert torch.allclose(score(), base)
        assert torch.allclose(score(), red)
    with host.use("red"):
        assert torch.allclose(score(), red)
    host.add_adapter("green")
    with host.use("green"):
        assert torch.allclose(score(), base, atol=1e-5)  # fresh: B = 0
    with host.use("red"):
        assert torch.allclose(score(), red)
    # the active adapter deleted (PEFT activates another) and added again under its name
    weights = host.adapter_weights("red")
    host.delete_adapter("red")
    host.add_adapter("red", seed=3)
    host.set_adapter_weights("red", weights)
    with host.use("red"):
        assert torch.allclose(score(), red)


def test_prompts_are_templated_once(host: ModelHost, monkeypatch: pytest.MonkeyPatch) -> None:
    req = kuhn_request()
    calls = []
    template = host.tokenizer.apply_chat_template
    monkeypatch.setattr(
        host.tokenizer, "apply_chat_template", lambda *a, **k: calls.append(1) or template(*a, **k)
    )
    first, cut = host.prompt_ids(req.messages)
    again, _ = host.prompt_ids([dict(m) for m in req.messages])
    other, _ = host.prompt_ids(kuhn_request(seed=3).messages)
    assert again == first and not cut and len(calls) == 1 + (other != first)
    again.append(0)  # callers own what they get
    assert host.prompt_ids(req.messages)[0] == first
    short, cut = host.prompt_ids(req.messages, max_tokens=5)
    assert cut and short == first[:2] + first[-3:]  # the rules' head and the moves' tail
    mark = host.text_ids(CUT)
    short, cut = host.prompt_ids(req.messages, max_tokens=40)
    head = (40 - len(mark)) // 2
    assert cut and short == first[:head] + mark + first[len(first) - (40 - len(mark) - head) :]


def test_choice_scores_are_remembered_until_a_weight_changes(host: ModelHost) -> None:
    req = kuhn_request()
    prompts, cands = (
        [host.prompt_ids(req.messages)[0]],
        [[host.text_ids(t) for t in req.action_texts]],
    )
    with host.use("red"), torch.no_grad():
        first = host.candidate_scores(prompts, cands)[0]
        assert len(host._memo["red"]) == len(cands[0])
        again = host.candidate_scores(prompts * 3, cands * 3)
        assert all(torch.equal(first, x) for x in again)
    with host.use("blue"), torch.no_grad():
        blue = host.candidate_scores(prompts, cands)[0]
    weights = host.adapter_weights("red")
    weights = {k: (v + 0.3 if "lora_B" in k else v) for k, v in weights.items()}
    host.set_adapter_weights("red", weights)  # loading new weights must not serve stale scores
    with host.use("red"), torch.no_grad():
        moved = host.candidate_scores(prompts, cands)[0]
        fresh = torch.stack([lp.sum() for lp in host.sequence_logprobs(prompts * 2, cands[0])])
    assert not torch.allclose(moved, first)
    assert torch.allclose(moved, fresh, atol=1e-5)
    # the other adapter's scores do not depend on red's weights: they stay remembered
    host._memo["blue"] = dict.fromkeys(host._memo["blue"], -1.0)  # marked, to see them served
    with host.use("blue"), torch.no_grad():
        assert host.candidate_scores(prompts, cands)[0].tolist() == [-1.0] * len(cands[0])
        host._memo["blue"].clear()
        assert torch.allclose(host.candidate_scores(prompts, cands)[0], blue, atol=1e-5)
    # an adapter dropped and added again under its name starts with nothing remembered
    host.delete_adapter("red")
    host.add_adapter("red", seed=5)
    host.set_adapter_weights("red", weights)
    assert "red" not in host._memo
    host.set_adapter_weights("red", host.adapter_weights("blue"))
    with host.use("red"), torch.no_grad():
        assert torch.allclose(host.candidate_scores(prompts, cands)[0], blue, atol=1e-5)


def test_head_clusters_group_prompts_by_shared_head() -> None:
    head = list(range(100))
    seat0 = [head + [1, 200 + k] for k in range(3)]
    seat1 = [list(range(5)) + [999] * 20 + [k] for k in range(2)]  # shares only 5 with seat 0
    prompts = [seat0[0], seat1[0], seat0[1], seat1[1], seat0[2], [7] * 10]
    assert sorted(head_clusters(prompts)) == [[0, 2, 4], [1, 3], [5]]


def test_choice_scores_equal_separate_forwards_for_mixed_prompts(host: ModelHost) -> None:
    """Heads, tails of different lengths, multi-token candidates: each score must equal the
    log-prob of a plain forward over prompt + candidate."""
    envs = []
    for seed, moves in [(0, []), (1, [1]), (2, [0, 1]), (3, [])]:
        env = games.make("kuhn_poker")
        env.reset(seed=seed)
        for m in moves:
            env.step(m)
        envs.append(env)
    agent = Agent("x", "player", policy=None, mode="choice")  # type: ignore[arg-type]
    prompts = [host.prompt_ids(agent.request(e, e.agent_selection).messages)[0] for e in envs]
    cands = [[host.text_ids(t) for t in ("[Call]", "[Fold]", "I bet. [Bet]")]] * len(envs)
    with torch.no_grad():  # a trained-looking adapter, so the LoRA path is exercised too
        for name, w in host.model.named_parameters():
            if "lora_B" in name and ".red." in name:
                w.normal_(0, 0.3)
    with host.use("red"), torch.no_grad():
        got = host.candidate_scores(prompts, cands)
        for p, cs, scores in zip(prompts, cands, got, strict=True):
            for c, score in zip(cs, scores, strict=True):
                ids = torch.tensor([p + c])
                logits = host.model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
                ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None]).sum()
                assert abs(float(score) - float(ref)) < 1e-4


def test_candidates_sharing_beginnings_run_once_and_score_as_separate_forwards(
    host: ModelHost,
) -> None:
    """Proposal-like candidates (a shared beginning, then branches, of different lengths):
    the prefix tree runs each shared token once, and its scores and their LoRA gradients
    equal separate forwards over prompt + candidate (a shared node's gradient sums its
    candidates')."""
    from marl.agents.host.prefill import _prefix_tree

    texts = ["[propose 1 2 3]", "[propose 1 2 0]", "[propose 0 4 1]", "[Accept]", "[No deal]"]
    cands = [host.text_ids(t) for t in texts]
    tree = _prefix_tree([c[:-1] for c in cands])
    assert len(tree.ids) < sum(len(c) - 1 for c in cands)  # shared tokens run once
    assert [[tree.ids[n] for n in path] for path in tree.paths] == [c[:-1] for c in cands]
    for path in tree.paths:  # each node sees exactly its own path
        assert tree.ancestors[path[-1]].nonzero().flatten().tolist() == sorted(path)
    prompts = [host.text_ids("Split the pool."), host.text_ids("You keep the hats. Propose:")]
    rows = [prompts[0]] * 5 + [prompts[1]] * 4
    weights = torch.linspace(-1.0, 1.0, 9)
    lora = [p for n, p in host.model.named_parameters() if "lora_" in n and ".red." in n]
    with torch.no_grad():  # a trained adapter: gradients reach lora_A through lora_B
        for p in lora:
            p.normal_(std=0.05, generator=torch.Generator().manual_seed(p.numel()))
    with host.use("red"):
        with torch.no_grad():
            host.clear_score_memo()
            packed = torch.cat(host.candidate_scores(prompts, [cands, cands[1:]]))
        trained = torch.cat(host.candidate_scores(prompts, [cands, cands[1:]]))
        tree_grads = torch.autograd.grad((trained * weights).sum(), lora)
        want = torch.stack([x.sum() for x in host.sequence_logprobs(rows, [*cands, *cands[1:]])])
        row_grads = torch.autograd.grad((want * weights).sum(), lora)
    torch.testing.assert_close(packed, want.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(trained.detach(), want.detach(), atol=1e-5, rtol=0)
    assert any(float(g.abs().max()) > 1e-4 for g in row_grads)
    for got, ref in zip(tree_grads, row_grads, strict=True):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)


def test_grouped_query_attention_reads_kv_heads_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Masked batches over a shared KV cache on a grouped-query model: the host's attention
    never copies the KV heads, and its scores and LoRA gradients are transformers' sdpa's."""
    from transformers.integrations import sdpa_attention

    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or real(x, n))
    model, tok = build_tiny_random(num_heads=4, kv_heads=2)
    h = ModelHost(model, tok)
    h.add_adapter("red", targets=["q_proj", "k_proj", "v_proj", "o_proj"], seed=3)
    for name, p in h.model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(1))
    envs = [games.make("tic_tac_toe") for _ in range(3)]
    for seed, (env, moves) in enumerate(zip(envs, [[], [4], [0, 8]], strict=True)):
        env.reset(seed=seed)
        for m in moves:
            env.step(m)
    agent = Agent("x", "player", policy=None, mode="choice")  # type: ignore[arg-type]
    prompts = [h.prompt_ids(agent.request(e, e.agent_selection).messages)[0] for e in envs]
    cands = [[h.text_ids(f"[{a}]") for a in e.legal_actions(e.agent_selection)] for e in envs]
    params = [p for p in h.model.parameters() if p.requires_grad]

    def scores_and_grads() -> tuple[torch.Tensor, torch.Tensor]:
        for p in params:
            p.grad = None
        with h.use("red"):
            scores = h.candidate_scores(prompts, cands)
        sum(s.logsumexp(0) - s[0] for s in scores).backward()
        return torch.cat(scores).detach(), torch.cat([p.grad.flatten() for p in params])

    assert h.model.config._attn_implementation == "sdpa_gqa"
    gqa = scores_and_grads()
    assert copies == []
    h.model.set_attn_implementation("sdpa")
    sdpa = scores_and_grads()
    assert copies and set(copies) == {2}
    assert torch.allclose(gqa[0], sdpa[0], atol=1e-5)
    assert torch.allclose(gqa[1], sdpa[1], atol=1e-6, rtol=1e-4)
