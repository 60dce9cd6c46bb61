"""The base of every config model."""

from typing import Any, Self

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid")

    def replace(self, **changes: Any) -> Self:
        """A copy with these fields replaced and every validator run again (pydantic's
        ``model_copy(update=...)`` runs none).  A nested model may be given as a model."""
        return self.model_validate({**self.model_dump(by_alias=True), **changes})
