"""The dashboard's comparison form: flat HTML fields, turned into the API's
``ComparisonCreate``.

Fields (what a page posting to ``POST /comparisons/new`` sends; every one a string):
``model``, ``device``, ``training_file``, ``validation_file`` (dataset ids),
``memory_budget_mb`` (blank: the device's), ``methods`` (repeated: mebp, mezo, backprop),
``learning_rates_<method>`` (numbers separated by commas or spaces; blank: the defaults),
``max_steps`` or ``max_device_time_s`` (one of them), ``eval_every`` (blank: a tenth of each
job's steps), ``allow_infeasible`` ("true" when checked), each shared hyperparameter under
its API name (``seq_len``, ``batch_size``, ...; blank: the API's default) and the CSRF token.
"""

from __future__ import annotations

import re

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError

from app.comparison_schemas import (
    DEFAULT_LEARNING_RATES,
    DEFAULT_METHODS,
    OWN_HYPERPARAMETERS,
    ComparisonCreate,
    SharedHyperparameters,
)
from app.training_schemas import PUBLIC_NAMES
from app.web.job_form import hyperparameter_inputs

METHODS = tuple(DEFAULT_LEARNING_RATES)
RATES_PREFIX = "learning_rates_"
# the jobs' settings a comparison sets per job, by their public names
PUBLIC_OWN = {PUBLIC_NAMES.get(name, name) for name in OWN_HYPERPARAMETERS}


class ComparisonForm(BaseModel):
    model: str = "preset:qwen2.5-0.5b"
    device: str = "iphone-15-pro-max"
    memory_budget_mb: str = ""
    training_file: str = ""
    validation_file: str = ""
    methods: list[str] = Field(default_factory=lambda: list(DEFAULT_METHODS))
    learning_rates: dict[str, str] = Field(default_factory=dict)  # method -> as typed
    max_steps: str = ""
    max_device_time_s: str = ""
    eval_every: str = ""
    allow_infeasible: bool = False
    hyperparameters: dict[str, str] = Field(default_factory=dict)  # shared, as typed

    @classmethod
    def from_fields(cls, single: dict[str, str], methods: list[str]) -> ComparisonForm:
        """The form from flat HTML fields (``methods`` is the repeated checkbox)."""
        own = {k: v for k, v in single.items() if k in cls.model_fields
               and k not in ("methods", "learning_rates", "hyperparameters")}
        rates = {k.removeprefix(RATES_PREFIX): v for k, v in single.items()
                 if k.startswith(RATES_PREFIX)}
        shared = {k: v for k, v in single.items() if k in shared_names()}
        return cls(**own, methods=methods, learning_rates=rates, hyperparameters=shared)

    def to_comparison(self) -> ComparisonCreate:
        """Raises pydantic's ``ValidationError`` naming the field, as the API would, or
        ``ValueError`` for the form's own text fields."""
        given = {k: v for k, v in self.hyperparameters.items() if v.strip()}
        rates = {method: _numbers(f"{RATES_PREFIX}{method}", text)
                 for method, text in self.learning_rates.items() if text.strip()}
        return ComparisonCreate(
            model=self.model, device=self.device, training_file=self.training_file,
            validation_file=self.validation_file, methods=self.methods,
            memory_budget_mb=self.memory_budget_mb or None, learning_rates=rates,
            max_steps=self.max_steps or None, max_device_time_s=self.max_device_time_s or None,
            eval_every=self.eval_every or None, allow_infeasible=self.allow_infeasible,
            hyperparameters=SharedHyperparameters(**given))


def shared_names() -> set[str]:
    return {field.alias or name for name, field in SharedHyperparameters.model_fields.items()}


def shared_inputs(values: dict[str, str]) -> list[dict]:
    """The job form's inputs for the hyperparameters a comparison shares."""
    return [field for field in hyperparameter_inputs(values) if field["name"] not in PUBLIC_OWN]


def _numbers(field: str, text: str) -> list[float]:
    try:
        return [float(word) for word in re.split(r"[\s,;]+", text.strip())]
    except ValueError:
        raise ValueError(f"{field}: numbers separated by commas, not {text!r}") from None


def describe(exc: Exception) -> str:
    if isinstance(exc, RequestValidationError | ValidationError):
        return "; ".join(f"{_where(e['loc'])}{e['msg'].removeprefix('Value error, ')}"
                         for e in exc.errors())
    return str(exc)


def _where(loc: tuple) -> str:
    """``learning_rates.mezo: `` for a field (the request's ``body`` left out)."""
    names = [str(part) for part in loc if part != "body"]
    return f"{'.'.join(names)}: " if names else ""
