"""Small helpers the OpenAI-compatible providers share (URL building, error text)."""

from __future__ import annotations

import json
from typing import Any

import httpx

_SNIPPET = 300


def endpoint(base_url: str, path: str) -> str:
    """``{base_url}/v1/{path}``, without doubling a ``/v1`` the base URL already ends with."""
    base = (base_url or "").strip().rstrip("/")
    if not base:
        raise ValueError("base_url is required")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
    if not base.endswith("/v1"):
        base += "/v1"
    return f"{base}/{path.lstrip('/')}"


def auth_headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


def http_error_text(resp: httpx.Response) -> str:
    """``HTTP 401 Unauthorized: <the server's error message or a body excerpt>``."""
    detail = ""
    try:
        body: Any = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        body = None
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            detail = err["message"]
        elif isinstance(err, str):
            detail = err
        elif isinstance(body.get("message"), str):
            detail = body["message"]
        elif isinstance(body.get("detail"), str):
            detail = body["detail"]
    if not detail:
        try:
            detail = resp.text
        except Exception:  # pragma: no cover - undecodable body
            detail = ""
    phrase = f" {resp.reason_phrase}" if resp.reason_phrase else ""
    return f"HTTP {resp.status_code}{phrase}" + (f": {snippet(detail)}" if detail.strip() else "")


def parse_json(resp: httpx.Response) -> Any:
    """The body as JSON; raises ValueError with a body excerpt when it is not JSON."""
    try:
        return resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"response is not valid JSON ({exc}): {snippet(resp.text)!r}") from None


def request_failure(exc: httpx.HTTPError, where: str, timeout: float) -> str:
    """What went wrong before any response came back: a timeout or a transport error."""
    if isinstance(exc, httpx.TimeoutException):
        return f"{where}: timed out after {timeout:g}s ({type(exc).__name__})"
    return f"{where}: request failed: {type(exc).__name__}: {exc}"


def json_body(resp: httpx.Response, where: str, error: type[Exception]) -> Any:
    """The body of a successful response as JSON; raises `error` for an HTTP error status
    or a body that is not JSON, with the server's own message where it gave one."""
    if resp.status_code >= 400:
        raise error(f"{where}: {http_error_text(resp)}")
    try:
        return parse_json(resp)
    except ValueError as exc:
        raise error(f"{where}: {exc}") from None
