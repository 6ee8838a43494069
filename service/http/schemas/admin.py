"""The admin API (/admin/*): what a reload or rollback is asked, and its answer while it still runs.

The answers of a finished reload and the status are the core's own records (service.core.outcomes).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"path": "/bundles/v20261123T0700"}]})

    path: str | None = Field(None, min_length=1, max_length=4096,
                             description="Bundle directory (or bundle root) on the server; omitted, the version "
                             "the root's CURRENT pointer names.")


class ReloadPending(BaseModel):
    outcome: str = "pending"
    message: str
