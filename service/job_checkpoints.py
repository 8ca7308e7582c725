"""A job's checkpoint's id, made of the job's and the step's: the same checkpoint however
often the step is trained, and its step read back from the id alone (a paging cursor stays
good after its checkpoint was pruned)."""

from __future__ import annotations

import re

_STEP = re.compile(r"[0-9]{1,9}")


def checkpoint_id(job_id: str, step: int) -> str:
    return f"{_prefix(job_id)}{step}"


def checkpoint_step(job_id: str, checkpoint: str) -> int | None:
    """The step of the job's checkpoint id ``checkpoint`` (kept or pruned), None if it is no
    id of the job's."""
    rest = checkpoint.removeprefix(_prefix(job_id))
    return int(rest) if rest != checkpoint and _STEP.fullmatch(rest) else None


def _prefix(job_id: str) -> str:
    return f"ckpt-{job_id.removeprefix('job-')}-"
