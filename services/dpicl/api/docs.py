"""``/docs`` (Swagger UI) and ``/redoc`` without a CDN: the pages load their scripts and
styles from this server, which serves them from the ``fastapi-offline`` package. FastAPI's
own pages load them from cdn.jsdelivr.net and stay blank on a machine without internet.
``DPICL_DOCS=false`` serves neither page (``/openapi.json`` stays)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from dpicl.errors import NotFound

ASSETS_URL = "/docs/assets"
#: The only files served, and their media types.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}


def assets_dir() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def docs_router(app: FastAPI) -> APIRouter:
    # Resolved at start: a missing package fails the start, not a request.
    static = assets_dir()
    router = APIRouter(include_in_schema=False)
    openapi_url = app.openapi_url or "/openapi.json"
    title = app.title

    @router.get("/docs")
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
        )

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

    @router.get(ASSETS_URL + "/{name}")
    async def asset(name: str) -> FileResponse:
        media = ASSETS.get(name)
        if media is None:  # a fixed list: no path from the URL reaches the file system
            raise NotFound(f"no documentation asset {name[:80]!r}")
        return FileResponse(static / name, media_type=media)

    return router
