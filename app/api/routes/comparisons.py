"""``/v1/comparisons``: methods side by side on one model, dataset and phone, each curve as
validation loss against simulated on-device time."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.common_schemas import ErrorMessage
from app.comparison_schemas import ComparisonCreate, ComparisonPublic, ComparisonsPublic
from app.comparison_submit import find_by_idempotency_key, submit_comparison
from app.comparison_view import comparison_public
from app.keys import Principal
from service.crud import TERMINAL, request_cancel
from service.models import Comparison, Job

router = APIRouter(prefix="/comparisons", tags=["comparisons"])


@router.post("", response_model=ComparisonPublic, status_code=status.HTTP_201_CREATED,
             responses={200: {"description": "a repeat of an Idempotency-Key: the same "
                              "comparison"},
                        409: {"model": ErrorMessage, "description": "the Idempotency-Key was "
                              "used for a different request body"},
                        422: {"description": "invalid field; no method predicted to fit "
                              "(smallest_budget_mb per method); more jobs than the tenant's "
                              "queue holds (learning_rates)"}})
def create_comparison(body: ComparisonCreate, request: Request, response: Response,
                      session: SessionDep, settings: SettingsDep, principal: PrincipalDep,
                      idempotency_key: Annotated[str | None, Header(min_length=1,
                                                                    max_length=128)] = None
                      ) -> ComparisonPublic:
    """One normal job per method and learning rate, each planned at the device's budget
    (``config: "auto"``) and queued with the comparison in one transaction. A method
    predicted not to fit gets no job and is listed ``does_not_fit``; the others run."""
    if idempotency_key is not None:
        existing = find_by_idempotency_key(session, principal.tenant, idempotency_key, body)
        if existing is not None:
            response.status_code = status.HTTP_200_OK
            return comparison_public(session, existing)
    try:
        comparison = submit_comparison(session, body, settings, request.app.state.enqueue,
                                       tenant=principal.tenant,
                                       redis=request.app.state.redis,
                                       idempotency_key=idempotency_key)
    except IntegrityError:  # the same key, submitted concurrently: the other one won
        session.rollback()
        comparison = None if idempotency_key is None else find_by_idempotency_key(
            session, principal.tenant, idempotency_key, body)
        if comparison is None:
            raise
        response.status_code = status.HTTP_200_OK
    return comparison_public(session, comparison)


@router.get("", response_model=ComparisonsPublic)
def list_comparisons(session: SessionDep, principal: PrincipalDep,
                     model: Annotated[str | None, Query(max_length=256)] = None,
                     device: Annotated[str | None, Query(max_length=64)] = None,
                     limit: Annotated[int, Query(ge=1, le=100)] = 20) -> ComparisonsPublic:
    """The tenant's latest comparisons, newest first; of one model, one device if given."""
    query = select(Comparison).where(Comparison.tenant == principal.tenant)
    if model is not None:
        query = query.where(Comparison.model == model)
    if device is not None:
        query = query.where(Comparison.device_id == device)
    comparisons = session.exec(query.order_by(col(Comparison.created_at).desc())
                               .limit(limit)).all()
    return ComparisonsPublic(data=[comparison_public(session, c) for c in comparisons],
                             count=len(comparisons))


@router.get("/{comparison_id}", response_model=ComparisonPublic)
def read_comparison(comparison_id: str, session: SessionDep,
                    principal: PrincipalDep) -> ComparisonPublic:
    return comparison_public(session, get_comparison_or_404(session, comparison_id,
                                                            principal))


@router.post("/{comparison_id}/cancel", response_model=ComparisonPublic)
def cancel_comparison(comparison_id: str, session: SessionDep,
                      principal: PrincipalDep) -> ComparisonPublic:
    """Its queued jobs are cancelled at once; running ones stop after their current step
    (each keeps its adapter and its curve so far)."""
    comparison = get_comparison_or_404(session, comparison_id, principal)
    for job_id in session.exec(select(Job.id).where(Job.comparison_id == comparison.id,
                                                    col(Job.status).not_in(TERMINAL))).all():
        request_cancel(session, job_id)
    session.commit()
    return comparison_public(session, comparison)


def get_comparison_or_404(session: Session, comparison_id: str,
                          principal: Principal) -> Comparison:
    """Another tenant's comparison is as unknown as one that never was."""
    comparison = session.get(Comparison, comparison_id)
    if comparison is None or comparison.tenant != principal.tenant:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no comparison {comparison_id!r}")
    return comparison
