"""The base of every config model."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are errors, never silently ignored."""

    model_config = ConfigDict(extra="forbid")
