"""The live pages: the jobs list, a job with its charts, and fleets."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlmodel import col, select

from app.api.deps import SessionDep
from app.api.paging import MAX_LISTED
from app.api.routes.checkpoints import list_checkpoints
from app.api.routes.fleets import list_fleets, read_fleet
from app.api.routes.jobs import cancel_job, read_job
from app.job_view import job_public
from app.web.auth import PagePrincipal, SessionRequired
from app.web.base_page import base_links
from app.web.csrf import FormToken
from app.web.templating import script_json, templates
from service.crud import latest_adapter
from service.models import Job, Metric

router = APIRouter(include_in_schema=False)


@router.get("/", dependencies=[SessionRequired])
def home() -> RedirectResponse:
    return RedirectResponse("/explorer", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, principal: PagePrincipal) -> HTMLResponse:
    jobs = session.exec(select(Job).where(Job.tenant == principal.tenant)
                        .order_by(col(Job.created_at).desc()).limit(100)).all()
    rows = [job_public(job, latest_adapter(session, job.id)).model_dump(mode="json")
            for job in jobs]
    return templates.TemplateResponse(request, "jobs.html", {"jobs": rows})


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, session: SessionDep,
             principal: PagePrincipal) -> HTMLResponse:
    job = read_job(job_id, session, principal).model_dump(mode="json")
    checkpoints = list_checkpoints(job_id, session, principal, limit=MAX_LISTED)
    return templates.TemplateResponse(request, "job.html", {
        "job": job, "job_json": script_json(job),
        "base_links": base_links(request.app.state.base_exports, session, job),
        "checkpoints_json": script_json(checkpoints.model_dump(mode="json")),
        "checkpoints_shown": MAX_LISTED})


@router.post("/jobs/{job_id}/cancel", dependencies=[FormToken])
def cancel_from_page(job_id: str, session: SessionDep,
                     principal: PagePrincipal) -> RedirectResponse:
    try:
        cancel_job(job_id, session, principal)
    except HTTPException as exc:
        if exc.status_code != status.HTTP_409_CONFLICT:  # already finished: just show it
            raise
    return RedirectResponse(f"/jobs/{job_id}", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/fleets", response_class=HTMLResponse)
def fleets_page(request: Request, session: SessionDep, principal: PagePrincipal) -> HTMLResponse:
    fleets = list_fleets(session, principal).model_dump(mode="json")["data"]
    return templates.TemplateResponse(request, "fleets.html", {"fleets": fleets})


@router.get("/fleets/{fleet_id}", response_class=HTMLResponse)
def fleet_page(fleet_id: str, request: Request, session: SessionDep,
               principal: PagePrincipal) -> HTMLResponse:
    fleet = read_fleet(fleet_id, session, principal).model_dump(mode="json")
    per_device = fleet["summary"]["devices"] <= PER_DEVICE_VIEWS
    rounds = [{**r, "participants": None} for r in fleet["rounds"]]  # the charts' share
    curves = loss_curves(session, fleet) if per_device else []
    return templates.TemplateResponse(request, "fleet.html", {
        "fleet": fleet, "per_device": per_device, "curves_drawn": bool(curves),
        "listed": fleet["members"][:PER_DEVICE_VIEWS],
        "chart": script_json({"curves": curves,
                              "members": fleet["members"], "rounds": rounds,
                              "references": fleet["references"]})})


# a fleet of up to this many devices gets a loss curve and a participation row per device;
# a larger one, its first devices' rows and its rounds summed up over their cohorts
PER_DEVICE_VIEWS = 32


def member_label(member: dict) -> str:
    """A device of the fleet as its legend names it (a simulated phone by its shard)."""
    shard = member["shard"]
    return member["device"] if shard is None else f"{member['device']} · shard {shard + 1}"


def loss_curves(session, fleet: dict) -> list[dict]:
    """Loss per step of the fleet's own jobs, one curve per device; a federated device's
    curve runs through every round it trained in, on the fleet's step axis (round r's local
    step s at r × local_steps + s), broken between rounds. Each point names its job."""
    runs: dict[int, list[tuple[str, int]]] = {}  # member -> [(job id, step offset)]
    for current in fleet["rounds"]:
        for seat in current["participants"]:
            if seat["job_id"] is not None:
                runs.setdefault(seat["member"], []).append(
                    (seat["job_id"], current["index"] * fleet["local_steps"]))
    curves = []
    for index, member in enumerate(fleet["members"]):
        if not fleet["rounds"] and member["job_id"] is not None:
            runs[index] = [(member["job_id"], 0)]
        curve = {"label": member_label(member), "steps": [], "loss": [], "jobs": []}
        for job_id, offset in runs.get(index, []):
            rows = session.exec(select(Metric.step, Metric.loss).where(Metric.job_id == job_id)
                                .order_by(Metric.step)).all()
            if rows and curve["steps"]:  # a gap in the line between rounds
                for points in (curve["steps"], curve["loss"], curve["jobs"]):
                    points.append(None)
            curve["steps"] += [offset + step for step, _ in rows]
            curve["loss"] += [loss for _, loss in rows]
            curve["jobs"] += [job_id] * len(rows)
        if curve["steps"]:
            curves.append(curve)
    return curves
