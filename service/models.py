"""The service's tables. The database is the source of truth: Redis only carries job ids."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, BigInteger, Column, Index
from sqlmodel import Field, SQLModel

from mebp_core.config import TrainConfig
from mebp_core.plan.summary import PlanSummary
from service.comparison_spec import ComparisonSpec
from service.fleet_spec import FleetSpec, RoundSeat
from service.job_plan import JobPlan, UnplannedJob
from service.json_column import ModelJSON, check_on_load

WEBHOOK_URL_CHARS = 2048


def utc_now() -> datetime:
    return datetime.now(UTC)


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"

    id: int | None = Field(default=None, primary_key=True)
    tenant: str = Field(index=True, max_length=64)
    key_hash: str = Field(unique=True, max_length=128)  # sha256 hex of the key, never the key
    scopes: str = Field(default="user", max_length=64)  # "user" or "admin"
    created_at: datetime = Field(default_factory=utc_now)
    prefix: str = Field(default="", max_length=16)  # the key's first characters, to list it
    expires_at: datetime | None = None  # None: until revoked
    last_used_at: datetime | None = None  # to the minute (KEY_USE_RESOLUTION_S)


class Device(SQLModel, table=True):
    __tablename__ = "devices"

    id: str = Field(primary_key=True, max_length=64)
    name: str = Field(max_length=128)
    ram_mb: int | None = None
    budget_mb: int | None = None
    chip: str | None = Field(default=None, max_length=128)
    relative_compute: float | None = None
    sources: list[str] = Field(default_factory=list, sa_column=Column(JSON, nullable=False))
    builtin: bool = True  # from devices.json; an admin may add others


class Dataset(SQLModel, table=True):
    __tablename__ = "datasets"

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(index=True, max_length=64)
    filename: str = Field(max_length=255)  # as uploaded, for display only
    path: str = Field(max_length=1024)  # generated, inside the storage root
    bytes: int = Field(sa_column=Column(BigInteger, nullable=False))
    rows: int
    sha256: str = Field(max_length=64)
    # a fleet's shard: the dataset its rows were dealt from (None: a whole upload)
    source_id: str | None = Field(default=None, foreign_key="datasets.id", max_length=40)
    created_at: datetime = Field(default_factory=utc_now)


@check_on_load
class Fleet(SQLModel, table=True):
    __tablename__ = "fleets"

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(index=True, max_length=64)
    model: str = Field(max_length=255)
    spec: FleetSpec = Field(sa_column=Column(ModelJSON(FleetSpec), nullable=False))
    # federated fleets stop after the round in progress once asked to
    cancel_requested: bool = False
    # its preparation (the status shown is app/fleet_status.py's, derived from it): preparing
    # (a worker deals its rows and makes its jobs), ready, failed (``error`` says
    # why) or cancelled (before its jobs were made)
    status: str = Field(default="ready", max_length=16)
    error: str | None = None
    # seats in its tenant's queue held for the jobs it has yet to make (a preparing fleet's,
    # a federated fleet's later rounds): counted as queued, less its jobs queued now
    reserved_jobs: int = 0
    # times the reconciler asked a worker again to prepare it, its earlier ask lost (the
    # worker killed, Redis emptied); it fails once its tries reach max_attempts
    prepare_retries: int = 0
    # where its rounds' ends and its own end are POSTed (``service.webhooks``)
    webhook_url: str | None = Field(default=None, max_length=WEBHOOK_URL_CHARS)
    created_at: datetime = Field(default_factory=utc_now)


@check_on_load
class Comparison(SQLModel, table=True):
    """Methods side by side on one model, dataset and device: one job per method and
    learning rate (``Job.comparison_id``); ``spec`` keeps the request and each method's plan
    (or why it does not fit)."""

    __tablename__ = "comparisons"
    __table_args__ = (Index("ix_comparisons_tenant_idempotency_key", "tenant",
                            "idempotency_key", unique=True),)

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(index=True, max_length=64)
    model: str = Field(max_length=255)
    device_id: str = Field(foreign_key="devices.id", max_length=64)
    spec: ComparisonSpec = Field(sa_column=Column(ModelJSON(ComparisonSpec), nullable=False))
    idempotency_key: str | None = Field(default=None, max_length=128)
    request_sha256: str | None = Field(default=None, max_length=64)
    created_at: datetime = Field(default_factory=utc_now)


@check_on_load
class FleetRound(SQLModel, table=True):
    """One round of a federated fleet: who was selected and what became of each, and the
    global adapter the finished updates were combined into (kept under the storage root)."""

    __tablename__ = "fleet_rounds"

    fleet_id: str = Field(foreign_key="fleets.id", primary_key=True, max_length=40)
    index: int = Field(primary_key=True)
    status: str = Field(max_length=16)  # running, done, failed (no update to combine)
    participants: list[RoundSeat] = Field(
        default_factory=list, sa_column=Column(ModelJSON(list[RoundSeat]), nullable=False))
    eval_loss: float | None = None
    simulated_wall_s: float | None = None  # the slowest participant's on-device estimate
    started_at: datetime = Field(default_factory=utc_now)
    finished_at: datetime | None = None


@check_on_load
class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    # a repeated Idempotency-Key finds the job the first request made
    __table_args__ = (Index("ix_jobs_tenant_idempotency_key", "tenant", "idempotency_key",
                            unique=True),)

    id: str = Field(primary_key=True, max_length=40)
    tenant: str = Field(index=True, max_length=64)
    # validating, queued, running, succeeded, failed, cancelled
    status: str = Field(index=True, max_length=16)
    model: str = Field(max_length=255)
    device_id: str | None = Field(default=None, foreign_key="devices.id", max_length=64)
    memory_budget_bytes: int | None = Field(default=None, sa_column=Column(BigInteger))
    config: dict = Field(sa_column=Column(JSON, nullable=False))  # TrainConfig, dumped
    plan: PlanSummary | UnplannedJob | None = Field(default=None,
                                                    sa_column=Column(ModelJSON(JobPlan)))
    training_file: str = Field(foreign_key="datasets.id", max_length=40)
    validation_file: str | None = Field(default=None, foreign_key="datasets.id", max_length=40)
    fleet_id: str | None = Field(default=None, foreign_key="fleets.id", index=True,
                                 max_length=40)
    comparison_id: str | None = Field(default=None, foreign_key="comparisons.id", index=True,
                                      max_length=40)
    # among a tenant's queued jobs, a higher one is claimed first (``service.fairness``):
    # a fleet's reference runs (REFERENCE_PRIORITY) wait behind its rounds' jobs
    priority: int = 0
    # the adapter training starts from (a federated round's global adapter), if any
    init_adapter: str | None = Field(default=None, max_length=1024)
    idempotency_key: str | None = Field(default=None, index=True, max_length=128)
    # the sha256 of the request that made it (``body_sha256``): a key reused with another
    # request is refused; None for a job made without a key, or before it was recorded
    request_sha256: str | None = Field(default=None, max_length=64)
    enforcement: str | None = Field(default=None, max_length=32)  # cgroup-v2, cgroup-v1, rlimit
    error_code: str | None = Field(default=None, max_length=64)
    error_message: str | None = None
    error_detail: dict | None = Field(default=None, sa_column=Column(JSON))
    cancel_requested: bool = False
    step: int = 0
    total_steps: int = 0
    last_loss: float | None = None
    peak_anon_bytes: int | None = Field(default=None, sa_column=Column(BigInteger))
    # anonymous + shared: what the kernel charges and cannot reclaim
    peak_memory_bytes: int | None = Field(default=None, sa_column=Column(BigInteger))
    # the cgroup's own peak usage, reclaimable file pages included
    cgroup_peak_bytes: int | None = Field(default=None, sa_column=Column(BigInteger))
    # measured: the median of the latest attempt's steps after its first
    step_time_s: float | None = None
    attempts: int = 0
    worker: str | None = Field(default=None, max_length=128)  # host:pid running it
    heartbeat_at: datetime | None = None  # refreshed while it runs; stale means worker lost
    metadata_: dict = Field(default_factory=dict, sa_column=Column("metadata", JSON,
                                                                   nullable=False))
    # where its status moves and checkpoints are POSTed (``service.webhooks``)
    webhook_url: str | None = Field(default=None, max_length=WEBHOOK_URL_CHARS)
    created_at: datetime = Field(default_factory=utc_now)
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def train_config(self) -> TrainConfig:
        """The stored config, validated (its schema version included): every reader uses
        this, never the raw dict."""
        return TrainConfig.model_validate(self.config)

    def planned(self) -> PlanSummary | None:
        """The job's plan summary; None for a job recorded unplanned (``UnplannedJob``)."""
        return self.plan if isinstance(self.plan, PlanSummary) else None


class Event(SQLModel, table=True):
    __tablename__ = "events"
    # a page of a job's events in id order reads only that page
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=40)
    at: datetime = Field(default_factory=utc_now)
    kind: str = Field(max_length=32)
    message: str
    data: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))


class Metric(SQLModel, table=True):
    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_job_id_step", "job_id", "step", unique=True),
                      Index("ix_metrics_job_id_id", "job_id", "id"))

    id: int | None = Field(default=None, primary_key=True)
    job_id: str = Field(foreign_key="jobs.id", max_length=40)
    step: int
    loss: float | None = None
    data: dict = Field(default_factory=dict, sa_column=Column(JSON, nullable=False))
    at: datetime = Field(default_factory=utc_now)


class RegisteredModel(SQLModel, table=True):
    """A Hugging Face model directory inside the configured model roots, by name."""

    __tablename__ = "models"

    name: str = Field(primary_key=True, max_length=64)
    path: str = Field(max_length=1024)
    model_type: str = Field(max_length=64)
    parameters: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(default_factory=utc_now)


class Adapter(SQLModel, table=True):
    __tablename__ = "adapters"

    id: str = Field(primary_key=True, max_length=40)
    job_id: str = Field(foreign_key="jobs.id", index=True, max_length=40)
    path: str = Field(max_length=1024)
    sha256: str = Field(max_length=64)
    bytes: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(default_factory=utc_now)


class JobCheckpoint(SQLModel, table=True):
    """The adapter a job kept at a step (every ``checkpoint_every`` steps, and at its last
    its final adapter, the ``Adapter``'s folder), with that step's losses; its files under
    the job's folder. Its id is made of the job's and the
    step, so a step trained again after a resume is the same checkpoint, written again."""

    __tablename__ = "job_checkpoints"
    __table_args__ = (Index("ix_job_checkpoints_job_id_step", "job_id", "step", unique=True),)

    id: str = Field(primary_key=True, max_length=64)
    job_id: str = Field(foreign_key="jobs.id", max_length=40)
    step: int
    train_loss: float | None = None
    valid_loss: float | None = None  # when the job validated at this step, else None
    path: str = Field(max_length=1024)  # the PEFT adapter folder
    sha256: str = Field(max_length=64)  # of its PEFT zip, as an adapter's
    bytes: int = Field(sa_column=Column(BigInteger, nullable=False))
    created_at: datetime = Field(default_factory=utc_now)


class DashboardSession(SQLModel, table=True):
    """A signed-in browser: the cookie holds a random id, the table only its sha256."""

    __tablename__ = "dashboard_sessions"

    id_hash: str = Field(primary_key=True, max_length=64)
    tenant: str = Field(index=True, max_length=64)
    key_hash: str = Field(index=True, max_length=128)  # the key it signed in with
    created_at: datetime = Field(default_factory=utc_now)
    expires_at: datetime = Field(index=True)


class WebhookSecret(SQLModel, table=True):
    """A tenant's webhook signing secret, as Standard Webhooks writes one: ``whsec_`` and the
    key in base64. Kept as it is: signing needs it."""

    __tablename__ = "webhook_secrets"

    tenant: str = Field(primary_key=True, max_length=64)
    secret: str = Field(max_length=128)
    created_at: datetime = Field(default_factory=utc_now)
    # the secret a rotation replaced, signing beside it until previous_expires_at
    previous_secret: str | None = Field(default=None, max_length=128)
    previous_expires_at: datetime | None = None


class WebhookDelivery(SQLModel, table=True):
    """One event of a job or fleet to POST to its ``webhook_url``, until a 2xx or the attempts
    run out (``service.webhooks``); kept after, as its record."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_status_next_attempt_at", "status",
                            "next_attempt_at"),
                      # a fleet's event is seen in its rows, by any API process: once each
                      Index("ix_webhook_deliveries_fleet_id_fleet_event", "fleet_id",
                            "fleet_event", unique=True))

    id: str = Field(primary_key=True, max_length=40)  # the webhook-id header
    tenant: str = Field(max_length=64)
    job_id: str | None = Field(default=None, foreign_key="jobs.id", index=True, max_length=40)
    fleet_id: str | None = Field(default=None, foreign_key="fleets.id", max_length=40)
    fleet_event: str | None = Field(default=None, max_length=32)  # round-<n> or end
    event: str = Field(max_length=64)  # job.succeeded, fleet.round.done...
    url: str = Field(max_length=WEBHOOK_URL_CHARS)
    body: str  # the exact JSON sent at every attempt
    status: str = Field(default="pending", max_length=16)  # pending, delivered, failed
    attempts: int = 0
    next_attempt_at: datetime | None = Field(default_factory=utc_now)  # None once it ended
    last_status_code: int | None = None
    last_error: str | None = None
    created_at: datetime = Field(default_factory=utc_now)
    delivered_at: datetime | None = None
