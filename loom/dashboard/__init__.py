"""The dashboard at /dashboard: server-rendered pages for a namespace's operators and
owners, part of the API process.

Every figure a page shows and every change it makes goes through the API's own ops,
called in-process with the signed-in person's token (loom.dashboard.visit): a page
can show and do exactly what that token may over HTTP, no more, and there is no second
path to the data. The token lives in an HttpOnly, SameSite=Strict session cookie (gone
when the browser session ends or on sign-out) and is never written into a page.
"""
