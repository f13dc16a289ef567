"""The web UI's routes, given to the app factory (service/app.py `build_app(routes=...)`): the pages, the run's page
with its review, and the API's twin of the submission form."""

from __future__ import annotations

from starlette.routing import BaseRoute

from service import pages, review_pages, submit


def web_routes() -> list[BaseRoute]:
    return [*pages.ROUTES, *review_pages.ROUTES, *submit.ROUTES]
