"""The dashboard's job form: flat HTML fields, turned into the API's ``JobCreate``."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from app.schemas import Hyperparameters, JobCreate

# the knobs are one flat object; anything larger or deeper is not a configuration, and
# json.loads would recurse once per level (a RecursionError, not a message)
MAX_CONFIG_CHARS = 16 << 10
MAX_CONFIG_DEPTH = 8


def parse_config(text: str) -> str | dict:
    """``"auto"`` or the knobs' JSON; ``ValueError`` naming the field when it is not that."""
    if text in ("", "auto"):
        return "auto"
    if len(text) > MAX_CONFIG_CHARS:
        raise ValueError(f"config: longer than {MAX_CONFIG_CHARS} characters")
    if _nesting_depth(text) > MAX_CONFIG_DEPTH:
        raise ValueError(f"config: nested deeper than {MAX_CONFIG_DEPTH} levels")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"config: not JSON ({exc.msg}, column {exc.colno})") from None


def _nesting_depth(text: str) -> int:
    """How deep JSON's brackets nest, outside strings, without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


class JobForm(BaseModel):
    model: str
    device: str = ""
    memory_budget_mb: str = ""
    training_file: str = ""
    validation_file: str = ""
    eval_every: int | None = Field(default=None, ge=1)
    seq_len: int = Field(default=256, ge=2)
    steps: int = Field(default=20, ge=1)
    batch_size: int = Field(default=1, ge=1)
    lora_rank: int = Field(default=8, ge=1)
    learning_rate: float = Field(default=1e-4, gt=0)
    optimizer: Literal["sgd", "adamw"] = "sgd"
    method: Literal["mebp", "mezo", "backprop"] = "mebp"
    config: str = "auto"  # "auto", or the knobs of the configuration clicked, as JSON
    configuration: str = "auto"  # that configuration's id, for display
    allow_infeasible: bool = False

    @field_validator("eval_every", mode="before")
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        return None if value == "" else value

    def to_job(self, training_file: str) -> JobCreate:
        """Raises pydantic's ``ValidationError`` naming the field, as the API would, or
        ``ValueError`` for the form's own text fields."""
        config = parse_config(self.config)
        return JobCreate(
            model=self.model, training_file=training_file, device=self.device or None,
            validation_file=self.validation_file or None,
            memory_budget_mb=float(self.memory_budget_mb) if self.memory_budget_mb else None,
            method=self.method, config=config, allow_infeasible=self.allow_infeasible,
            hyperparameters=Hyperparameters(
                steps=self.steps, seq_len=self.seq_len, batch_size=self.batch_size,
                lora_rank=self.lora_rank, learning_rate=self.learning_rate,
                optimizer=self.optimizer, eval_every=self.eval_every))
