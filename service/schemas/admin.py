"""The admin API (/admin/*): what a reload or rollback is asked, what it answers, and the reload status."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Trigger = Literal["admin", "watch"]


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"path": "/bundles/v20261123T0700"}]})

    path: str | None = Field(None, min_length=1, max_length=4096,
                             description="Bundle directory (or bundle root) on the server; omitted, the version "
                             "the root's CURRENT pointer names.")


class ReloadPending(BaseModel):
    outcome: str = "pending"
    message: str


class VersionInfo(BaseModel):
    version: str = Field(description="Bundle directory name, as /search reports it in `index.version`.")
    build_time: str
    count: int
    path: str
    loaded_at: str


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


class AdminStatus(BaseModel):
    state: Literal["loading", "ready", "failed"]
    current: VersionInfo | None
    history: list[VersionInfo] = Field(description="Previous versions kept loaded for rollback, newest first.")
    keep_versions: int
    root: str | None = Field(description="The bundle root whose CURRENT pointer is followed, if any.")
    watch_interval_s: float | None = Field(description="Pointer polling interval; null when not watching.")
    reloads_pending: int = Field(description="Reloads or rollbacks queued or running.")
    last_reload: ReloadOutcome | None
