"""The base of every config model, and the number types its fields use."""

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"a number is meant here, not the boolean {str(value).lower()}")
    return value


#: An integer field: ``true`` is never silently read as the count 1.
Int = Annotated[int, BeforeValidator(_not_bool)]
#: A real-valued field: not a bool either (and, with the model's ``allow_inf_nan=False``,
#: neither ``.inf`` nor ``.nan``).
Float = Annotated[float, BeforeValidator(_not_bool)]

#: Compute precision of a local model's forward passes: fp32, or bf16/fp16 autocast (weights,
#: LoRA adapters and optimizer state stay fp32); auto: bf16 where the hardware has bf16
#: matrix units (AMX, AVX512-BF16, a GPU), else fp32.  fp16 needs a GPU.
Precision = Literal["fp32", "bf16", "fp16", "auto"]


class StrictModel(BaseModel):
    """Unknown keys are errors, never silently ignored; floats are finite."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    def replace(self, **changes: Any) -> Self:
        """A copy with these fields replaced and every validator run again (pydantic's
        ``model_copy(update=...)`` runs none).  A nested model may be given as a model."""
        return self.model_validate({**self.model_dump(by_alias=True), **changes})
