"""``/v1/fleets/{id}/members`` and ``/rounds``: a fleet's members and rounds a page at a time
(a population's 10,000 phones; its body lists only the first members)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from app.api.deps import PrincipalDep, SessionDep
from app.api.paging import DEFAULT_ROWS, Limit, after_query, page_of
from app.api.routes.fleets import read_fleet_or_404
from app.fleet_schemas import FleetMembersPublic, FleetRoundsPublic
from app.fleet_summary import job_facts, latest_jobs, members_page, round_public
from service.federation import rounds_of

router = APIRouter(prefix="/fleets", tags=["fleets"])
LINK = {200: {"headers": {"Link": {"description": 'the next page, if any: <url>; rel="next"'}}}}


@router.get("/{fleet_id}/members", response_model=FleetMembersPublic, responses=LINK)
def read_members(fleet_id: str, request: Request, response: Response, session: SessionDep,
                 principal: PrincipalDep, after: int | None = after_query("member index"),
                 limit: Limit = DEFAULT_ROWS) -> FleetMembersPublic:
    """A page of the fleet's members in index order, each with its latest job."""
    fleet = read_fleet_or_404(session, fleet_id, principal)
    start = 0 if after is None else after + 1
    members = members_page(session, fleet, start, start + limit + 1,
                           latest_jobs(rounds_of(session, fleet.id)))
    rows, next_url = page_of(members, limit, request, response, lambda member: member.index)
    return FleetMembersPublic(data=rows, count=len(rows), next=next_url)


@router.get("/{fleet_id}/rounds", response_model=FleetRoundsPublic, responses=LINK)
def read_rounds(fleet_id: str, request: Request, response: Response, session: SessionDep,
                principal: PrincipalDep, after: int | None = after_query("round index"),
                limit: Limit = DEFAULT_ROWS) -> FleetRoundsPublic:
    """A page of the fleet's rounds in order, each with its cohort and its summary."""
    fleet = read_fleet_or_404(session, fleet_id, principal)
    rounds = [r for r in rounds_of(session, fleet.id)
              if after is None or r.index > after][:limit + 1]
    facts = job_facts(session, fleet.id)
    rows, next_url = page_of(rounds, limit, request, response, lambda r: r.index)
    return FleetRoundsPublic(data=[round_public(r, fleet, facts) for r in rows],
                             count=len(rows), next=next_url)
