"""The API docs page (``GET /docs``), working offline, and the console's static files.

Swagger UI's script and style sheet come from the ``fastapi-offline`` package (a dependency of
the ``api`` extra, which ships Swagger UI 5's ``swagger-ui-bundle.js`` and ``swagger-ui.css``),
served from ``/console/static/swagger/``; nothing is loaded from a CDN. The page's own script
(``docs.js``) starts Swagger UI on ``/openapi.json`` and adds the console session's CSRF token
to the requests "Try it out" sends. Where ``fastapi-offline`` is not installed, ``/docs`` is a
plain page that lists every endpoint from the OpenAPI document instead (no script at all).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from harvest_celery._web.console.html import STATIC, e
from harvest_celery._web.pages import GRAPH_CSS

HERE = Path(__file__).resolve().parent.parent / "static"
MEDIA = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
DOCS_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; font-src 'self' data:; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)


def swagger_dir() -> Path | None:
    """``fastapi_offline``'s static folder, if that package is installed (never imported)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "static"
    return folder if (folder / "swagger-ui-bundle.js").is_file() else None


def static_files() -> dict[str, tuple[bytes, str]]:
    """``{name: (bytes, media type)}`` of everything under ``/console/static``."""
    files = {p.name: (p.read_bytes(), MEDIA[p.suffix]) for p in HERE.iterdir() if p.suffix in MEDIA}
    files["graph.css"] = (GRAPH_CSS.encode(), MEDIA[".css"])
    swagger = swagger_dir()
    if swagger is not None:
        for name in ("swagger-ui-bundle.js", "swagger-ui.css"):
            files[f"swagger/{name}"] = ((swagger / name).read_bytes(), MEDIA[Path(name).suffix])
    return files


def swagger_page(title: str, csrf: str) -> str:
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f'<link rel="stylesheet" href="{STATIC}/swagger/swagger-ui.css">'
        f"<title>{e(title)} · API docs</title></head><body>"
        f'<div id="swagger-ui" data-openapi="/openapi.json" data-csrf="{e(csrf)}"></div>'
        f'<script src="{STATIC}/swagger/swagger-ui-bundle.js"></script>'
        f'<script src="{STATIC}/docs.js"></script></body></html>'
    )


def plain_docs(spec: dict[str, Any]) -> str:
    """The self-made fallback: every operation of the OpenAPI document, as a table."""
    rows = []
    for path, item in spec.get("paths", {}).items():
        for method, op in item.items():
            rows.append(
                f'<tr><td class="mono">{e(method.upper())}</td><td class="mono">{e(path)}</td>'
                f"<td>{e(op.get('summary', ''))}</td><td>{e(op.get('description', ''))}</td></tr>"
            )
    return (
        f"<h1>{e(spec.get('info', {}).get('title', 'API'))}</h1>"
        '<p>The OpenAPI document is at <a href="/openapi.json">/openapi.json</a>.</p>'
        '<table class="grid" id="operations"><thead><tr><th>method</th><th>path</th>'
        f"<th>summary</th><th>description</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )
