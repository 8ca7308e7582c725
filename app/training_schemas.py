"""A request's training settings, derived from ``TrainConfig``'s own fields: the engine's knobs,
the workload the planner predicts from, and the hyperparameters of a job."""

from __future__ import annotations

import copy
from typing import Annotated

from pydantic import Field, StringConstraints, create_model
from pydantic.fields import FieldInfo

from app.api.request_model import RequestModel
from mebp_core import config as core
from mebp_core.plan.workload import PLAN_QUERY_FIELDS

LoraTargets = Annotated[str, StringConstraints(max_length=256)] | Annotated[
    list[Annotated[str, StringConstraints(min_length=1, max_length=64)]], Field(max_length=16)]


class EngineKnobs(RequestModel, core.EngineKnobs):
    """The engine's knobs as a request carries them: finite numbers, no booleans for
    counts."""


# TrainConfig fields whose public name is not the CLI's (``--lr`` is ``learning_rate``)
PUBLIC_NAMES = {"lr": "learning_rate"}


def _config_fields(names, **overrides) -> dict:
    """``TrainConfig``'s own fields (type, bounds, default, description), for a request
    body, under their public names: one definition of each setting."""
    fields = core.TrainConfig.model_fields

    def public(name: str) -> FieldInfo:
        if name not in PUBLIC_NAMES:
            return copy.copy(fields[name])
        return FieldInfo.merge_field_infos(fields[name], Field(alias=PUBLIC_NAMES[name]))

    return {**{name: (fields[name].annotation, public(name)) for name in names}, **overrides}


# TrainConfig fields a job request carries elsewhere or not at all: every other field is a
# hyperparameter, so a field added to TrainConfig is one with no other edit
_NOT_HYPERPARAMETERS = ("schema_version", "knobs", "method", "seed",
                        "validation_fraction", "skip_malformed", "data_start_batch")


class WorkloadFields(create_model(
        "Workload", __base__=RequestModel, **_config_fields(
            PLAN_QUERY_FIELDS, lora_targets=(LoraTargets, Field(default="all", description=(
                "the projections LoRA adapts: all, comma-separated suffixes or a list")))))):
    """What the planner's predictions depend on, besides the model and the knobs."""

    def workload(self) -> dict:
        """These fields alone, as ``TrainConfig`` takes them."""
        return self.model_dump(include=set(PLAN_QUERY_FIELDS))


class Hyperparameters(create_model(
        "Training", __base__=WorkloadFields, **_config_fields(
            [name for name in core.TrainConfig.model_fields
             if name not in PLAN_QUERY_FIELDS and name not in _NOT_HYPERPARAMETERS],
            checkpoint_every=(int | None, Field(default=None, ge=1, description=(
                "steps between checkpoints, from which a job resumes after losing its "
                "worker (default MEBP_CHECKPOINT_EVERY)")))))):
    """Training settings: ``TrainConfig``'s fields, named as in ``mebp train`` but for
    ``PUBLIC_NAMES`` (``learning_rate`` is ``--lr``)."""
