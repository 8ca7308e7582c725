"""Fairness between tenants: which queued job a free worker takes next, and which queued jobs
need a message on the queue to be taken at all.

A queue message means "a worker is free": the worker claims the oldest queued job of the
tenant that, among those with fewer than ``max_running_jobs_per_tenant`` jobs running, has
the fewest running, then was served least recently (its latest start), then has waited
longest; within a tenant, a job of higher ``priority`` first (a fleet's reference runs wait
behind its rounds' jobs). One tenant's backlog, or its day-long job, so delays another
tenant's next job by no more than the jobs already running.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import func
from sqlmodel import Session, col, select

from service.models import Job


def running_by_tenant(session: Session) -> dict[str, int]:
    rows = session.exec(select(Job.tenant, func.count()).where(Job.status == "running")
                        .group_by(Job.tenant)).all()
    return dict(rows)


def next_tenant(session: Session, max_running: int) -> str | None:
    """The tenant whose job a free worker takes next; None when every tenant with queued
    jobs is at its running limit (or none has any)."""
    oldest = dict(session.exec(select(Job.tenant, func.min(Job.created_at))
                               .where(Job.status == "queued").group_by(Job.tenant)).all())
    running = running_by_tenant(session)
    eligible = [tenant for tenant in oldest if running.get(tenant, 0) < max_running]
    if not eligible:
        return None
    last_start = dict(session.exec(select(Job.tenant, func.max(Job.started_at))
                                   .where(col(Job.tenant).in_(eligible))
                                   .group_by(Job.tenant)).all())

    def turn(tenant: str) -> tuple:  # never served first, then least recently
        started = last_start.get(tenant)
        return (running.get(tenant, 0), started is not None, started or oldest[tenant],
                oldest[tenant], tenant)
    return min(eligible, key=turn)


def oldest_queued(session: Session, tenant: str) -> Job | None:
    """The tenant's next job: of its highest priority, the oldest."""
    return session.exec(select(Job).where(Job.tenant == tenant, Job.status == "queued")
                        .order_by(col(Job.priority).desc(), Job.created_at, Job.id)
                        .limit(1)).first()


def ids_to_enqueue(session: Session, queued: list[Job], in_redis: Callable[[str], bool],
                   max_running: int) -> list[str]:
    """Of ``queued``, the ids whose message is missing and needed: per tenant, its oldest
    ones, as many as it may still start less the messages Redis holds for its jobs. A
    tenant at its limit gets none, so its backlog does not keep idle workers cycling."""
    running = running_by_tenant(session)
    held: dict[str, int] = {}
    missing: list[Job] = []
    for job in sorted(queued, key=lambda job: (job.created_at, job.id)):
        if in_redis(job.id):
            held[job.tenant] = held.get(job.tenant, 0) + 1
        else:
            missing.append(job)
    room = {tenant: max_running - running.get(tenant, 0) - held.get(tenant, 0)
            for tenant in {job.tenant for job in missing}}
    chosen = []
    for job in missing:
        if room[job.tenant] > 0:
            room[job.tenant] -= 1
            chosen.append(job.id)
    return chosen
