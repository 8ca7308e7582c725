"""A model packed for a job reports as it goes: an event every few seconds (and at the end)
with the tensors written so far, for the event stream and the job page."""

from __future__ import annotations

import time

from sqlmodel import Session

from service.crud import add_event
from service.models import Job

EVERY_S = 2.0


class PackingProgress:
    """``resolve_model``'s progress callback for one job."""

    def __init__(self, session: Session, job: Job, every_s: float = EVERY_S) -> None:
        self.session, self.job, self.every_s = session, job, every_s
        self.last = time.monotonic()

    def __call__(self, done: int, total: int, name: str) -> None:
        now = time.monotonic()
        if done < total and now - self.last < self.every_s:
            return
        self.last = now
        add_event(self.session, job_id=self.job.id, kind="log",
                  message=f"packing {self.job.model}: {done} of {total} tensors "
                  f"({done / total:.0%}), last {name}",
                  data={"packing": {"tensors_done": done, "tensors_total": total}})
        self.session.commit()
