"""Templates, the pages' shared context, and the small rules every page follows."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates

from loom.dashboard.visit import PATH, Visit
from loom.errors import Forbidden
from loom.models.session import AUTHOR_LABELS
from loom.sdk.transport import LoomError

HERE = Path(__file__).parent
templates = Jinja2Templates(directory=str(HERE / "templates"))


def _when(value: datetime | str | None) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters["when"] = _when
# A brief revision's author as words ("model" alone reads as a server-side model).
templates.env.globals["author_label"] = lambda author: AUTHOR_LABELS.get(author, author)
# Security headers every page carries: no framing, no sniffing, scripts only from Loom.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def page(visit: Visit | None, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    context.update(visit=visit, base=PATH, title=context.get("title", "Loom"))
    response = templates.TemplateResponse(request, name, context, status_code=status)
    response.headers.update(HEADERS)
    return response


def back(where: str, **query: Any) -> RedirectResponse:
    """After a change: see the page again (303, so a reload does not post twice)."""
    shown = {k: v for k, v in query.items() if v not in (None, "")}
    url = f"{PATH}{where}" + (f"?{urlencode(shown)}" if shown else "")
    return RedirectResponse(url, status_code=303, headers={"Cache-Control": "no-store"})


def problem(exc: LoomError) -> dict[str, Any]:
    """An op's refusal as a page shows it: the API's code, message, and field (already
    safe: the API never puts a driver's text in an answer)."""
    return {"status": exc.status, "error": exc.error, "message": exc.message, "field": exc.field}


def same_origin(request: Request) -> None:
    """A form post must come from a page of this server. The cookie is SameSite=Strict
    already; this also refuses a cross-site post from a browser that ignores that."""
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise Forbidden("a dashboard form must be posted from the dashboard", rule="same_origin")
