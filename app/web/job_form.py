"""The dashboard's job form: flat HTML fields, turned into the API's ``JobCreate``."""

from __future__ import annotations

from pydantic import BaseModel, Field
from pydantic_core import from_json

from app.job_schemas import JobCreate
from app.training_schemas import Hyperparameters
from mebp_core.config import Method
from mebp_core.config_args import value_kinds

# the knobs are one flat object: anything larger is not a configuration (nor deeper, which
# pydantic's parser refuses past its recursion limit, where json.loads raised RecursionError)
MAX_CONFIG_CHARS = 16 << 10


def parse_config(text: str) -> str | dict:
    """``"auto"`` or the knobs' JSON; ``ValueError`` naming the field when it is not that."""
    if text in ("", "auto"):
        return "auto"
    if len(text) > MAX_CONFIG_CHARS:
        raise ValueError(f"config: longer than {MAX_CONFIG_CHARS} characters")
    try:
        return from_json(text)
    except ValueError as exc:
        raise ValueError(f"config: not JSON ({exc})") from None


# the settings the form shows first; every other hyperparameter is under "more settings"
PROMINENT = ("steps", "seq_len", "batch_size", "lora_rank", "learning_rate", "optimizer",
             "eval_every")
FORM_DEFAULTS = {"steps": 20}  # a dashboard run: a little longer than the API's default


class JobForm(BaseModel):
    model: str
    device: str = ""
    memory_budget_mb: str = ""
    training_file: str = ""
    validation_file: str = ""
    method: Method = "mebp"
    config: str = "auto"  # "auto", or the knobs of the configuration clicked, as JSON
    configuration: str = "auto"  # that configuration's id, for display
    allow_infeasible: bool = False
    # every field of the API's Hyperparameters, as typed (blank: the API's default)
    hyperparameters: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def from_fields(cls, values: dict[str, str]) -> JobForm:
        """The form from flat HTML fields: its own, and one per hyperparameter."""
        own = {k: v for k, v in values.items() if k in cls.model_fields
               and k != "hyperparameters"}
        hyper = {k: v for k, v in values.items() if k in Hyperparameters.model_fields}
        return cls(**own, hyperparameters=hyper)

    def to_job(self, training_file: str) -> JobCreate:
        """Raises pydantic's ``ValidationError`` naming the field, as the API would, or
        ``ValueError`` for the form's own text fields."""
        config = parse_config(self.config)
        given = {k: v for k, v in self.hyperparameters.items() if v.strip() != ""}
        return JobCreate(
            model=self.model, training_file=training_file, device=self.device or None,
            validation_file=self.validation_file or None,
            memory_budget_mb=float(self.memory_budget_mb) if self.memory_budget_mb else None,
            method=self.method, config=config, allow_infeasible=self.allow_infeasible,
            hyperparameters=Hyperparameters(**given))


def hyperparameter_inputs(values: dict[str, str]) -> list[dict]:
    """One input per field of ``Hyperparameters``, derived from the field: its name, its
    description as the label's hint, a choice for a literal, a number or text otherwise."""
    inputs = []
    for field_name, field in Hyperparameters.model_fields.items():
        name = field.alias or field_name  # the public name, as the API takes it
        default = FORM_DEFAULTS.get(name, field.default)
        choices = _choices(field.annotation)
        value = values.get(name)
        if value is None:
            value = "" if default is None else str(default)
        inputs.append({
            "name": name, "label": name.replace("_", " "), "hint": field.description or "",
            "choices": choices, "value": value, "prominent": name in PROMINENT,
            "type": "text" if choices is None and _is_text(field.annotation) else "number",
            "placeholder": "default" if default is None else ""})
    return inputs


def _choices(annotation) -> list[str] | None:
    kinds, words = value_kinds(annotation)
    return words if words and not kinds else None


def _is_text(annotation) -> bool:
    """A field that takes words (LoRA targets), not only a number."""
    return not value_kinds(annotation)[0] <= {int, float}
