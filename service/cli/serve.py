"""``slicesched serve``: the HTTP API under uvicorn, on the managed Neo4j unless told otherwise."""

from __future__ import annotations

import argparse
import logging
import sys

from learned.choice import add_cost_model_argument
from service.core.queue import QUEUE_POLICIES
from service.live.settings import LIVE_PLACEMENTS, ServiceSettings, state_dir


def serve_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="slicesched serve", description="run the scheduling API (docs/API.md)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--placement", choices=LIVE_PLACEMENTS, help="default: $SLICESCHED_PLACEMENT or container")
    p.add_argument("--queue", choices=sorted(QUEUE_POLICIES), help="default: $SLICESCHED_QUEUE or fifo")
    p.add_argument("--lease-ttl-s", type=float, help="lease lifetime without renewal (default 10)")
    p.add_argument("--heartbeat-s", type=float, help="executor heartbeat period (default 2)")
    p.add_argument("--max-batch", type=int, help="leases per replica at once (default 8)")
    p.add_argument("--schedule-interval-s", type=float, help="slice policy: least time between steps (default 2)")
    p.add_argument("--headroom-utilisation", type=float,
                   help="replica placement: a model whose home executor is this busy gets a guest ahead of a "
                   "backlog where the what-if predicts no harm (0: only for backlogs; default "
                   "$SLICESCHED_HEADROOM_UTILISATION or 0.5)")
    p.add_argument("--confirm-drains", action=argparse.BooleanOptionalAction, default=None,
                   help="replica placement: drain a guest for an owner's backlog only where the what-if predicts "
                   "it makes the others' requests late (default $SLICESCHED_CONFIRM_DRAINS or on)")
    p.add_argument("--predictor", help="distributional predictor for the slack policy, adapted online: a folder "
                   "written by `slicesched predictors train`, or 'naive' (default: $SLICESCHED_PREDICTOR or none)")
    p.add_argument("--predictor-refit-s", type=float,
                   help="with a predictor: consider a refit this often (default $SLICESCHED_PREDICTOR_REFIT_S or 300)")
    add_cost_model_argument(p)
    p.add_argument("--leader-election", action=argparse.BooleanOptionalAction, default=None,
                   help="run for the leadership: of the serve processes on one database one leads, the others "
                        "stand by and take over when its term ends (default: $SLICESCHED_LEADER_ELECTION or off)")
    p.add_argument("--leader-ttl-s", type=float, help="a leader's term in seconds, renewed every fifth of it "
                                                      "(default: $SLICESCHED_LEADER_TTL_S or 5)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    import uvicorn

    from service.api.app import create_app
    from service.live.log_repeat import RepeatedLineFilter

    settings = ServiceSettings.from_env(placement=args.placement, queue=args.queue, lease_ttl_s=args.lease_ttl_s,
                                        heartbeat_s=args.heartbeat_s, max_batch=args.max_batch,
                                        schedule_interval_s=args.schedule_interval_s,
                                        headroom_utilisation=args.headroom_utilisation,
                                        confirm_drains=args.confirm_drains,
                                        cost_model=args.cost_model, predictor=args.predictor,
                                        predictor_refit_s=args.predictor_refit_s,
                                        leader_election=args.leader_election, leader_ttl_s=args.leader_ttl_s)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("neo4j.notifications").setLevel(logging.ERROR)  # "property key does not exist yet" on a new graph
    for handler in logging.getLogger().handlers:  # an outage's one warning per refused call: once per window
        handler.addFilter(RepeatedLineFilter())
    print(f"slicesched serve on http://{args.host}:{args.port} (placement {settings.placement}, queue {settings.queue}"
          + (f", leader election with {settings.leader_ttl_s:g} s terms" if settings.leader_election else "") + "); "
          f"admin key: $SLICESCHED_ADMIN_KEY or {state_dir() / 'admin.key'}; executor keys: "
          + ("$SLICESCHED_EXECUTOR_KEY and executor pools" if settings.executor_key
             else "executor pools only ('slicesched keys create-pool POOL')"), file=sys.stderr, flush=True)
    uvicorn.run(create_app(settings, freeze_gc=True), host=args.host, port=args.port, log_level=args.log_level,
                access_log=args.log_level == "debug", timeout_graceful_shutdown=5)
    return 0
