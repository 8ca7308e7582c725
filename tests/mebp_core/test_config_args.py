"""The CLI's options are derived from ``TrainConfig`` and its ``EngineKnobs``: every field is
an option with its description, and a field added to a model appears with no other edit; a
stored config is read back only at its own schema version."""

from __future__ import annotations

import argparse
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from mebp_core.cli import build_parser
from mebp_core.config import EngineKnobs, TrainConfig
from mebp_core.config_args import add_model_arguments, model_values


def test_every_config_field_is_a_train_option_with_its_description():
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    options = {action.dest: action for action in train._actions}
    fields = {**EngineKnobs.model_fields, **TrainConfig.model_fields}
    for name, field in fields.items():
        if name in ("schema_version", "knobs"):
            continue
        assert name in options, name
        assert options[name].help == field.description and field.description
        assert options[name].option_strings[0] == "--" + name.replace("_", "-")


def test_a_new_field_becomes_an_option_of_the_right_kind():
    class Knobs(BaseModel):
        speed: Literal["slow", "fast"] = Field(default="slow", description="how fast")
        chunk_tokens: int | None = Field(default=None, ge=1, description="chunk")
        buffer_bytes: int = Field(default=1 << 20, description="buffer")
        share: bool | Literal["auto"] = Field(default="auto", description="share")
        blocks: int | Literal["none"] = Field(default=1, description="blocks")

    parser = argparse.ArgumentParser()
    add_model_arguments(parser, Knobs)
    args = parser.parse_args(["--speed", "fast", "--chunk-tokens", "8", "--buffer-bytes",
                              "64K", "--no-share", "--blocks", "none"])
    assert Knobs(**model_values(args, Knobs)) == Knobs(
        speed="fast", chunk_tokens=8, buffer_bytes=64 << 10, share=False, blocks="none")
    assert Knobs(**model_values(parser.parse_args([]), Knobs)) == Knobs()
    for bad in (["--speed", "warp"], ["--blocks", "many"], ["--buffer-bytes", "lots"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_a_stored_config_of_another_schema_version_is_refused_by_name():
    from pydantic import ValidationError

    stored = TrainConfig(steps=3).model_dump(mode="json")
    assert TrainConfig.model_validate(stored) == TrainConfig(steps=3)  # round trip
    with pytest.raises(ValidationError, match="a config of schema version 2; this version "
                                              "reads and writes version 1"):
        TrainConfig.model_validate({**stored, "schema_version": 2})
