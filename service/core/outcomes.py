"""What the serving core reports of its versions and reloads; /admin/* answers these as they are.

They are pydantic models because they cross a boundary twice: the admin API's answers, and (ProcessState,
Trigger) the files the processes of `tandem serve --processes N` share (service.core.processes).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from models.agreement.score import Verdict
from models.encoders.student_manifest import TrainedOn

# follow: applied because another process of `--processes N` was told to (see service.core.processes).
Trigger = Literal["admin", "watch", "follow"]


class VersionInfo(BaseModel):
    version: str = Field(description="Bundle directory name, as /search reports it in `index.version`.")
    build_time: str
    count: int
    path: str
    loaded_at: str
    segments: int = Field(default=1, description="Segments the version is made of (tandem index update adds one).")
    deleted: int = Field(default=0, description="Rows of its segments that later changes deleted or replaced.")
    shared_segments: int = Field(default=0, description="Segments it shares with the version that was in service "
                                 "when it loaded: verified and loaded then, not again.")


class ProcessState(BaseModel):
    """One server process of `tandem serve --processes N`, as it last reported itself."""

    pid: int
    version: str | None = Field(description="The bundle version it serves (null while loading).")
    path: str | None
    applied: int = Field(description="The last change of the shared log it has applied.")
    updated_at: str


class ReloadOutcome(BaseModel):
    action: Literal["reload", "rollback"]
    trigger: Trigger
    outcome: Literal["ok", "rejected"]
    path: str | None = Field(default=None, description="The bundle that was tried (reloads).")
    current: VersionInfo | None = Field(default=None, description="The version in service afterwards.")
    previous: VersionInfo | None = Field(default=None, description="The version it replaced (ok outcomes).")
    error: str | None = Field(default=None, description="Why the candidate was refused; the old version kept serving.")
    started_at: str
    seconds: float
    sequence: int | None = Field(default=None, description="With several processes: this change's number in "
                                 "the group's shared log, which every process follows; null with one process.")
    processes: list[ProcessState] | None = Field(
        default=None, description="With several processes: each one's version once the change reached them all "
        "(or TANDEM_RELOAD_WAIT_S passed); null with one process.",
    )


class MemoryInfo(BaseModel):
    """What a collection costs in memory (service.core.memory; null where /proc cannot be read)."""

    load_rss_growth_bytes: int | None = Field(description="The process's resident memory (VmRSS) after the initial "
                                              "load less before it: what loading this collection took, its student "
                                              "included when it was the first to use it. Loads of several "
                                              "collections run at once, so each figure may include some of "
                                              "another's; a hot reload does not update it.")
    mapped_bytes: int | None = Field(description="Bytes of its files this process maps now: under its bundle root "
                                     "(the versions kept for rollback too), or its bundle. Paged in on demand: a "
                                     "bound on what they can add to resident memory, not what they hold.")


class StudentInfo(BaseModel):
    """The student encoding queries, and what it was distilled from: a corpus unlike the one served costs quality
    that nothing else reports."""

    path: str
    precision: str
    teacher: str
    created: str
    trained_on: TrainedOn | None = Field(description="Its corpus (path, sha256, documents), training texts and the "
                                         "bundle version it was distilled against; null for students distilled "
                                         "before it was recorded.")


class AgreementInfo(Verdict):
    """/admin/status's `agreement`: the student's agreement with the teacher on the version in service."""

    state: Literal["pending", "scoring", "scored", "partial"] = Field(
        description="pending: not scored yet; partial: the last round ran out of time, the rest is scored next")
    version: str | None = Field(default=None, description="The version the figures are of.")


class AdminStatus(BaseModel):
    state: Literal["loading", "ready", "failed"]
    current: VersionInfo | None
    history: list[VersionInfo] = Field(description="Previous versions kept loaded for rollback, newest first.")
    keep_versions: int
    root: str | None = Field(description="The bundle root whose CURRENT pointer is followed, if any.")
    watch_interval_s: float | None = Field(description="Pointer polling interval; null when not watching.")
    reloads_pending: int = Field(description="Reloads or rollbacks queued or running.")
    last_reload: ReloadOutcome | None
    student: StudentInfo | None = Field(default=None, description="The student in service (null while loading).")
    processes: list[ProcessState] | None = Field(
        default=None, description="With several processes: every live one and the version it serves (this "
        "status, the rest of it, is the answering process's own); null with one process.",
    )
    memory: MemoryInfo | None = Field(default=None, description="Its memory; null before it has loaded.")
    agreement: AgreementInfo | None = Field(default=None, description="The student's agreement with the teacher "
                                            "on each segment in service (service.core.agreement); null when "
                                            "TANDEM_AGREEMENT_BUDGET_S is 0.")
    collections: dict[str, AdminStatus] | None = Field(
        default=None, description="With several collections: each one's own status, by name (the rest of this "
        "status is the default collection's); null with one collection.",
    )


class CollectionsStatus(BaseModel):
    """GET /admin/collections: every collection's own status, by name."""

    collections: dict[str, AdminStatus]
