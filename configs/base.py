"""The base of every config model."""

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict

#: Compute precision of a local model's forward passes: fp32, or bf16/fp16 autocast (weights,
#: LoRA adapters and optimizer state stay fp32).  fp16 needs a GPU.
Precision = Literal["fp32", "bf16", "fp16"]


class StrictModel(BaseModel):
    """Unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid")

    def replace(self, **changes: Any) -> Self:
        """A copy with these fields replaced and every validator run again (pydantic's
        ``model_copy(update=...)`` runs none).  A nested model may be given as a model."""
        return self.model_validate({**self.model_dump(by_alias=True), **changes})
