"""Agents: the model registry, per-role policies (LoRA adapters on shared bases), decoding,
and the batched rollout engine.  Uses games; knows nothing of training.
"""

# Importing a backend module registers it with agents.policy.make_policy.
from agents import hf, openai_backend, scripted, vllm_backend  # noqa: F401
from agents.agent import Agent
from agents.policy import Policy, Request, Response, make_policy

__all__ = ["Agent", "Policy", "Request", "Response", "make_policy"]
