"""The admin endpoints on the HTTP front end: ``POST /v2/poolpipe/reload`` and ``GET /v2/poolpipe/plan`` (the
plan the sidecar dispatches to; control/reload.py does the reload itself)."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from scheduler.server.control.reload import PlanSwitch, ReloadError

log = logging.getLogger("poolpipe.sidecar.reload")


def plan_handler(planned: PlanSwitch) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``GET /v2/poolpipe/plan``: the deployment the sidecar dispatches to now (``poolpipe launch --sidecar``
    waits for it before stopping the servers of the previous one)."""
    async def handle(_request: web.Request) -> web.Response:
        return web.json_response({"directory": str(planned.serving), "manifest": str(planned.manifest_path),
                                  "generation": planned.generation, "reloads": planned.reloads,
                                  "reloading": planned.reloading})
    return handle


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


def reload_handler(planned: PlanSwitch, bind: str,
                   run: Callable[[Path | None], Awaitable[dict]] | None = None
                   ) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``POST /v2/poolpipe/reload`` (optional JSON body ``{"manifest": PATH}``): the report, or an error.

    Only loopback clients may reload while the sidecar listens on loopback (the default ``--bind``); a sidecar
    bound elsewhere accepts it from wherever it is reachable. ``run`` does the reload (default: this process's
    plan; ``serve --workers``: every worker's) and returns the report, or raises ReloadError."""
    async def this_process(path: Path | None) -> dict:
        return (await planned.reload(path)).to_dict()
    run = run or this_process

    async def handle(request: web.Request) -> web.Response:
        if not is_loopback(request.remote or "") and is_loopback(bind):
            return web.json_response({"error": "reload is accepted from loopback only"}, status=403)
        try:
            body = await request.json() if await request.read() else {}
        except ValueError as e:
            return web.json_response({"error": f"the body must be JSON like {{\"manifest\": PATH}}: {e}"}, status=400)
        if not isinstance(body, dict) or set(body) - {"manifest"} or not isinstance(body.get("manifest", ""), str):
            return web.json_response({"error": "the body may hold only {\"manifest\": PATH} (a string)"}, status=400)
        try:
            # shielded: a client that hangs up (the HTTP port then cancels its handler) never stops a reload midway
            report = await asyncio.shield(run(Path(body["manifest"]) if body.get("manifest") else None))
        except ReloadError as e:
            log.warning("event=reload_failed reason=%s", e)
            return web.json_response({"error": str(e)}, status=e.status)
        return web.json_response(report)
    return handle
