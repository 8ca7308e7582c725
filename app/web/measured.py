"""What jobs measured, placed beside the planner's predictions in the explorer."""

from __future__ import annotations

from sqlmodel import Session, select

from app.plan_schemas import PlanCreate
from mebp_core.units import MB
from service.models import Job

SAME_WORKLOAD = ("seq_len", "batch_size", "lora_rank", "optimizer", "compute_dtype", "quant",
                 "group_size")


def measured_points(session: Session, query: PlanCreate, tenant: str,
                    methods: tuple[str, ...] = ("mebp",), limit: int = 50) -> list[dict]:
    """One point per succeeded job of ``methods`` and the query's workload: its peak memory
    as the kernel counts it (anonymous + shared) and its measured step time (the median of
    the steps after the first)."""
    jobs = session.exec(select(Job).where(Job.tenant == tenant, Job.model == query.model,
                                          Job.status == "succeeded")
                        .order_by(Job.finished_at.desc()).limit(limit)).all()
    points = []
    for job in jobs:
        config, plan = job.train_config(), job.planned()
        if config.method not in methods or plan is None \
                or job.peak_memory_bytes is None or job.step_time_s is None:
            continue
        if any(getattr(config, name) != getattr(query, name) for name in SAME_WORKLOAD):
            continue
        points.append({"configuration": plan.configuration, "method": config.method,
                       "job_id": job.id,
                       "peak_mb": round(job.peak_memory_bytes / MB, 1),
                       "step_time_s": job.step_time_s})
    return points
