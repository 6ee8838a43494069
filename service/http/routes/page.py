"""GET /: a search page for people, in static HTML and JS shipped with the package (no build step, no CDN).

The page calls the same POST /search as any client. It learns from /ui/config whether API keys
are required, asks for one if so, and keeps it in a JS variable only: never in storage or cookies,
so it is gone with the tab. The page and its files are open (service.http.auth), the searches are not.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel

from service.http.deps import SettingsDep

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
# Only this origin's own files: a page that tried to load anything from a CDN would break here first.
CSP = ("default-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'; "
       "object-src 'none'")

router = APIRouter(include_in_schema=False)


class PageConfig(BaseModel):
    api_key_required: bool
    default_top_k: int
    max_top_k: int
    max_query_chars: int


@router.get("/")
def search_page() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html",
                        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"})


@router.get("/ui/config")
def page_config(request: Request, settings: SettingsDep) -> PageConfig:
    return PageConfig(api_key_required=bool(getattr(request.app.state, "api_keys_required", False)),
                      default_top_k=settings.default_top_k, max_top_k=settings.max_top_k,
                      max_query_chars=settings.max_query_chars)


def install_page(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
