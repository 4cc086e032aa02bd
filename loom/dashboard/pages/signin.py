"""Sign-in with a token, sign-out, and the landing redirect."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from loom.dashboard.render import back, page, same_origin
from loom.dashboard.visit import COOKIE, PATH, SignInNeeded, open_visit, principal_of

router = APIRouter()


@router.get("/")
async def home(request: Request) -> RedirectResponse:
    try:
        visit = await open_visit(request)
    except SignInNeeded:
        return back("/signin")
    return back("/saved" if visit.end_user else "/conversations")


@router.get("/signin")
async def signin_form(request: Request) -> HTMLResponse:
    return page(None, request, "signin.html", title="Sign in")


@router.post("/signin", dependencies=[Depends(same_origin)], response_model=None)
async def signin(
    request: Request, token: Annotated[str, Form(max_length=512)] = ""
) -> HTMLResponse | RedirectResponse:
    token = token.strip()
    who = await principal_of(request, token) if token else None
    if who is None:
        message = "Enter a token." if not token else "That token is not valid (unknown, revoked or expired)."
        return page(None, request, "signin.html", status=401, title="Sign in", error=message)
    response = back("/saved" if who.bounded else "/conversations")
    # No Max-Age: a session cookie, gone when the browser session ends.
    response.set_cookie(
        COOKIE,
        token,
        path=PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/signout", dependencies=[Depends(same_origin)])
async def signout() -> RedirectResponse:
    response = back("/signin")
    response.delete_cookie(COOKIE, path=PATH, httponly=True, samesite="strict")
    return response
