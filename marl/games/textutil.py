"""Text helpers shared by games whose legal moves form a large, regular family."""

from __future__ import annotations

LEGAL_PREFIX = "Legal moves: "


class CompactLegalMoves:
    """Mixin for TextGame subclasses: state a big legal-move family as a rule, not a list.

    Listing ``[answer -400] ... [answer 420]`` costs thousands of characters of every prompt
    and can push the text past its length limit.  A subclass returns the rule from
    ``legal_summary`` (``None`` keeps the base list); it replaces the base text's legal-moves
    line, and the base text is kept unchanged if that line is absent.
    """

    def legal_summary(self, agent: str) -> str | None:
        return None

    def text_observation(self, agent: str) -> str:
        text = super().text_observation(agent)  # type: ignore[misc]
        head, sep, _ = text.rpartition(LEGAL_PREFIX)
        summary = self.legal_summary(agent) if sep else None
        return f"{head}{sep}{summary}" if summary and sep else text
