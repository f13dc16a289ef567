"""The web UI's routes, given to the app factory (service/app.py `build_app(routes=...)`): the pages and the run's page
with its review (the API's routes, the submission form's twin among them, are the app's own)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from service import pages, review_pages


def web_routes() -> list[BaseRoute]:
    return [*pages.ROUTES, *review_pages.ROUTES]
