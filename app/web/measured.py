"""What jobs measured, placed beside the planner's predictions in the explorer."""

from __future__ import annotations

from statistics import median

from sqlmodel import Session, select

from app.models import Job, Metric
from app.schemas import PlanCreate
from mebp_core.units import MB

SAME_WORKLOAD = ("seq_len", "batch_size", "lora_rank", "optimizer", "compute_dtype", "quant",
                 "group_size")


def measured_points(session: Session, query: PlanCreate, tenant: str,
                    limit: int = 50) -> list[dict]:
    """One point per succeeded mebp job of the query's workload: its peak anonymous memory
    and median step time (the first step, which warms up, left out when there are more)."""
    jobs = session.exec(select(Job).where(Job.tenant == tenant, Job.model == query.model,
                                          Job.status == "succeeded")
                        .order_by(Job.finished_at.desc()).limit(limit)).all()
    points = []
    for job in jobs:
        config, plan = job.config, job.plan or {}
        if config["method"] != "mebp" or not plan.get("planned") or job.peak_anon_bytes is None:
            continue
        if any(config[name] != getattr(query, name) for name in SAME_WORKLOAD):
            continue
        times = session.exec(select(Metric.data).where(Metric.job_id == job.id)
                             .order_by(Metric.step)).all()
        times = [row["step_time_s"] for row in times]
        if not times:
            continue
        points.append({"configuration": plan["configuration"], "job_id": job.id,
                       "peak_mb": round(job.peak_anon_bytes / MB, 1),
                       "step_time_s": median(times[1:] or times)})
    return points
