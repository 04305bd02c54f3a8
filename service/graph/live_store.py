"""The live service's records in the GMG: requests (durable before they are answered), leases
as Slices, completions and ends in one transaction each, restart recovery and retention, and
key hashes (never keys). Every write that starts or ends a lease refreshes the busy windows of
the devices it touched in the same transaction, so the candidate-slot search sees a running
lease as busy (windows in epoch seconds: :mod:`service.domain.slice_state`)."""

from __future__ import annotations

from typing import Any

from neo4j import ManagedTransaction

from service.domain.error import InvalidInputError, NotFoundError
from service.graph.store import StorePart, check_id

#: Live Slices deleted per retention transaction. Slices of a busy fleet are spread over every
#: device, so each chunk holds the locks of most devices until it commits: 10,000 per chunk took
#: about 0.5 s at the steady-state size (benchmarks/candidate_slots.py), a stall for every lease
#: write meanwhile; 1,000 keeps it near the lease path's 50 ms target.
SLICE_DELETE_CHUNK = 1_000


class LiveStore(StorePart):
    QUERIES: tuple[str, ...] = ("create_request", "update_requests", "create_slices", "end_slices", "extend_slices",
               "live_tenants", "live_models",
               "live_requests", "delete_old_live_slices", "complete_leases", "finish_requests", "close_open_slices",
               "request_results", "upsert_executor_pool", "set_executor_pool_key", "set_tenant_key",
               "live_executor_pools", "record_slice_observations", "slice_observations",
               "acquire_leadership", "release_leadership", "leader_term")

    # ---- leader election (service.live.leader) ------------------------------------------------
    def acquire_leadership(self, name: str, holder: str, epoch: int, ttl_ms: int, grace_ms: int = 0,
                           outage_grace_ms: int = 0) -> dict[str, Any]:
        """Take or renew the leadership ``name`` (its term ``ttl_ms`` on the server's clock; an
        ended term is another's to take once it has stood ended ``grace_ms``, plus
        ``outage_grace_ms`` when it was first seen ended more than a term after its end):
        ``{holder, epoch, left_ms}`` as it stands after the call. Not fenced: it is how a
        contender learns whether it leads. One attempt, not the driver's retries (for up to
        ``db_timeout_s``, their pauses doubling): a failed ask raises at once and the caller asks
        again at its own cadence, so a leader whose Neo4j comes back renews within an interval,
        not after a retry pause of a second or more that let the standby's grace end first."""
        q, params = self._q("acquire_leadership", {"leadership": name, "holder": holder, "epoch": epoch,
                                                   "ttl_ms": ttl_ms, "grace_ms": grace_ms,
                                                   "outage_grace_ms": outage_grace_ms})
        with self.driver.session(database=self.database) as s, s.begin_transaction() as tx:
            row = tx.run(q.text, params).single(strict=True).data()
            tx.commit()
            return row

    def release_leadership(self, name: str, holder: str, epoch: int) -> bool:
        """End ``holder``'s term ``epoch`` now (a clean stop): whether it still held it."""
        return bool(self._write("release_leadership", leadership=name, holder=holder, epoch=epoch))

    def leader_term(self, tx: ManagedTransaction, name: str) -> dict[str, Any] | None:
        """The leadership's ``{holder, epoch, left_ms}`` read inside ``tx`` (a write fence), or
        None when nobody has led yet."""
        out = self._tx_run(tx, "leader_term", leadership=name)
        return out[0] if out else None

    def create_requests(self, rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """Persist accepted requests (with their prompts) in one transaction; all or nothing.
        A row with an idempotency key its tenant used before creates nothing; the answer maps
        each such key to the earlier request (uid, body_sha, status, token_budget, prompt_tokens)."""
        def work(tx: ManagedTransaction) -> dict[str, dict[str, Any]]:
            out = self._tx_run(tx, "create_request", rows=rows)
            matched = int(out[0]["matched"]) if out else 0
            if matched != len(rows):
                raise InvalidInputError(f"{len(rows) - matched} of {len(rows)} requests name an unknown model")
            return {str(e["idempotency_key"]): e for e in out[0]["existing"]} if out else {}

        return self._execute_write(work)

    def complete_leases(self, rows: list[dict[str, Any]]) -> set[str]:
        """Results of completed leases, each with its request's final state and its done Slice, in
        one transaction; returns the uids of the requests completed (a finished one is left out)."""
        if not rows:
            return set()
        rows = sorted(rows, key=lambda r: str(r["slice"]["uid"]))  # one lock order with create_slices
        out = self._write_slices("complete_leases", rows=rows)
        return set(out[0]["completed"]) if out else set()

    def request_results(self, uids: list[str]) -> dict[str, dict[str, Any]]:
        """Status and result of requests as Neo4j holds them, by uid (absent: unknown)."""
        return {str(r["uid"]): r for r in self._read("request_results", uids=list(uids))}

    def finish_requests(self, rows: list[dict[str, Any]]) -> set[str]:
        """Requests ending without a result (cancelled, failed), with their lease's end, in one
        transaction; returns the uids finished now (one finished before is left out)."""
        if not rows:
            return set()
        out = self._write_slices("finish_requests", rows=rows)
        return set(out[0]["finished"]) if out else set()

    def close_open_slices(self, end_wall: float) -> int:
        """Restart reconciliation: close the live Slices a previous process left open (their
        devices' busy windows are refreshed with them)."""
        out = self._write_slices("close_open_slices", end_wall=float(end_wall))
        return int(out[0]["closed"]) if out else 0

    def update_requests(self, rows: list[dict[str, Any]]) -> int:
        """Batched request updates; rows of requests already finished change nothing."""
        out = self._write("update_requests", rows=rows)
        return int(out[0]["updated"]) if out else 0

    def create_slices(self, rows: list[dict[str, Any]]) -> int:
        """Granted leases as running Slices (their devices' busy windows refreshed with them)."""
        rows = sorted(rows, key=lambda r: str(r["uid"]))  # one lock order with complete_leases: no deadlock
        out = self._write_slices("create_slices", rows=rows)
        return int(out[0]["created"]) if out else 0

    def end_slices(self, rows: list[dict[str, Any]]) -> int:
        """Ends of leases (their devices' busy windows refreshed with them)."""
        out = self._write_slices("end_slices", rows=rows)
        return int(out[0]["ended"]) if out else 0

    def extend_slices(self, rows: list[dict[str, Any]]) -> int:
        """Renewals past running leases' expected ends: each Slice's window end moves later (never
        earlier), its devices' busy windows refreshed with it; returns how many moved."""
        rows = sorted(rows, key=lambda r: str(r["uid"]))  # one lock order with create_slices
        out = self._write_slices("extend_slices", rows=rows)
        return int(out[0]["extended"]) if out else 0

    def record_slice_observations(self, rows: list[dict[str, Any]]) -> int:
        """Executors' measurements of slices on their Slice nodes (latency, layers, batch
        features, device: ``record_slice_observations.cypher``); returns how many were recorded
        (a row whose device is unknown is not)."""
        rows = sorted(rows, key=lambda r: str(r["uid"]))  # one lock order with create_slices
        out = self._write("record_slice_observations", rows=rows)
        return int(out[0]["recorded"]) if out else 0

    def slice_observations(self, since_wall: float = 0.0) -> list[dict[str, Any]]:
        """Slices with a measured latency observed at or after ``since_wall`` (epoch s), oldest first."""
        return self._read("slice_observations", since=float(since_wall))

    def live_tenants(self) -> list[dict[str, Any]]:
        return self._read("live_tenants")

    def live_models(self) -> list[dict[str, Any]]:
        return self._read("live_models")

    def live_requests(self, since: float) -> list[dict[str, Any]]:
        return [r["request"] for r in self._read("live_requests", since=float(since))]

    def delete_old_live_slices(self, before_wall: float, *, chunk: int = SLICE_DELETE_CHUNK) -> int:
        """Delete live Slices that ended before ``before_wall`` (epoch s), in bounded chunks (one
        transaction each: a chunk locks the devices its slices ran on while it commits, so it is
        kept short beside the lease writes that need the same devices)."""
        total = 0
        while True:
            out = self._write("delete_old_live_slices", before_wall=float(before_wall), limit=chunk)
            deleted = int(out[0]["deleted"]) if out else 0
            total += deleted
            if deleted < chunk:
                return total

    def live_executor_pools(self) -> list[dict[str, Any]]:
        return self._read("live_executor_pools")

    # ---- keys (hashes only) ---------------------------------------------------------------------
    def upsert_executor_pool(self, pool_id: str, **props: Any) -> None:
        self._write("upsert_executor_pool", pool_id=check_id("pool", pool_id), props=props)

    def set_tenant_key(self, tenant_id: str, key_hash: str | None) -> None:
        """A tenant's new key hash, or ``None``: revoked. :class:`NotFoundError` for no tenant."""
        if not self._write("set_tenant_key", tenant_id=tenant_id, key_hash=key_hash):
            raise NotFoundError(f"no tenant {tenant_id!r}")

    def set_executor_pool_key(self, pool_id: str, key_hash: str | None) -> None:
        if not self._write("set_executor_pool_key", pool_id=pool_id, key_hash=key_hash):
            raise NotFoundError(f"no executor pool {pool_id!r}")
