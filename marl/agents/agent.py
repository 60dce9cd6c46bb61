"""An agent is a role instance: a name, a role, a policy and the prompt it is given."""

from __future__ import annotations

from dataclasses import dataclass

from marl.agents.policy import Policy, Request

FREE_INSTRUCTION = (
    "Think briefly if you need to, then end your answer with your move in "
    "brackets, exactly as listed, for example {example}."
)


@dataclass
class Agent:
    """One seat-taker.  ``system_prompt`` is already formatted (no placeholders left)."""

    name: str
    role: str
    policy: Policy
    system_prompt: str = ""
    mode: str = "free"

    def request(self, env, agent_id: str) -> Request:
        """Build the decision request for ``agent_id``'s turn in ``env`` (a ``TextGame``)."""
        legal = env.legal_actions(agent_id)
        texts = [env.action_text(a) for a in legal]
        user = env.observe(agent_id)["text"]
        if self.mode == "free" and texts:
            user += "\n" + FREE_INSTRUCTION.format(example=texts[0])
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": user})
        return Request(messages=messages, legal=legal, action_texts=texts, env=env, agent=agent_id)
