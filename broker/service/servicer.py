"""The gRPC servicers: proto in, a call on the service core, proto out.

Each RPC is a few lines. What every call shares is in :func:`_rpc`: the per-client rate
limit, reading the bearer token, refusing a request that did not parse, the admin check,
every field's type and range (``convert.check_request``), the stream limit, and turning
any failure into a status through the one table in ``errors.py``. Handlers are
registered from the service descriptors with deserializers that never raise, so that
bytes which are not the request message become INVALID_ARGUMENT (with the parser's
complaint) instead of gRPC's generic INTERNAL.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError

from bursar.broker import codec, policy_apply
from bursar.broker.decisions import DECISION_TYPES, Granted, Queued, Rejected
from bursar.broker.engine import Engine
from bursar.broker.errors import ErrorCode, RequestError
from bursar.broker.policy import PolicySpec
from bursar.broker.service import convert
from bursar.broker.service.auth import Principal, bearer_token
from bursar.broker.service.core import ServiceCore
from bursar.broker.service.errors import ShuttingDown, Unauthenticated, row_for, status_for
from bursar.broker.service.limits import client_key
from bursar.broker.specs import spec_to_dict
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb

if TYPE_CHECKING:  # psycopg is an optional extra: only the shared journal needs it
    from bursar.broker.journal_pg import Topology

__all__ = ["AdminServicer", "BrokerServicer", "generic_handler", "status_message"]

log = logging.getLogger(__name__)

_KIND_BY_PROTO = {pb.DecisionKind.Value(f"DECISION_KIND_{k.upper()}"): k for k in DECISION_TYPES}


RESUME_METADATA = "bursar-resume-seq"
"""Initial-metadata key of a Watch stream: the journal entry its live events start after
(every event before it is in the stream's opening snapshot or replay). A client that loses
the stream before any live event resumes with from_seq = this."""


class _Headers:
    """Yielded first by a stream that sends its own initial metadata once it is ready."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata


class _Malformed:
    """Stands for a request whose bytes did not parse as its message."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _safe(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, ValueError, TypeError, RuntimeError) as exc:
            return _Malformed(exc)

    return deserialize


def _rpc(
    *,
    admin: bool = False,
    stream: bool = False,
    admin_for: Callable[[Any], str] | None = None,
    committed: bool = False,
) -> Callable[..., Any]:
    """Wrap an RPC implementation ``fn(self, request, principal[, context])``.
    ``admin_for(request)`` names what in a request needs the admin token ("" for nothing):
    it is refused as PERMISSION_DENIED before its fields are checked, as an admin RPC is.
    ``committed``: the implementation answers from committed values only, having waited
    for its own entries' commit (the core's ``acquire``), so the answer waits for no
    other; every other call waits for the commit batch (``durable``) before it answers."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        name = fn.__name__

        async def enter(
            self: _Base, request: Any, context: grpc.aio.ServicerContext
        ) -> tuple[Principal, str]:
            metadata = context.invocation_metadata()
            try:
                token, bad = bearer_token(metadata), None
            except Unauthenticated as exc:
                token, bad = None, exc
            # The peer names only a client without a token: not asked for otherwise.
            peer = "" if token is not None else (context.peer() or "unknown")
            key = client_key(token, peer, self.core.tokens.digest)
            self.core.limits.admit(key)
            if bad is not None:
                raise bad
            principal = self.core.tokens.authenticate(token)
            if admin:
                principal.require_admin(f"{self.service_name}.{name}")
            if admin_for is not None and not isinstance(request, _Malformed):
                what = admin_for(request)
                if what:
                    principal.require_admin(f"{self.service_name}.{what}")
            if isinstance(request, _Malformed):
                raise RequestError(
                    ErrorCode.INVALID_ARGUMENT,
                    "(request)",
                    f"the request is not a valid {self.service_name}.{name} message: "
                    f"{request.error}",
                )
            # Every field's type and range, before the handler compares or adds any value.
            convert.check_request(request)
            return principal, key

        if stream:

            @functools.wraps(fn)
            async def stream_handler(
                self: _Base, request: Any, context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                key = None
                try:
                    principal, k = await enter(self, request, context)
                    self.core.limits.open_stream(k)
                    key = k
                    # The stream opens on committed state: a replay or snapshot then holds
                    # no entry that is yet to be published to it at its commit.
                    await self.core.settled()
                    async for item in fn(self, request, principal):
                        # Nothing leaves before the journal entries it may show are committed.
                        await self.core.durable()
                        if isinstance(item, _Headers):
                            # The stream is registered: from here on nothing is missed.
                            await context.send_initial_metadata(item.metadata)
                            continue
                        yield item
                    self.core.metrics.on_rpc(name, "OK", None)
                except Exception as exc:
                    self.core.metrics.on_rpc(name, _code(exc), None)
                    await self._abort(context, name, exc)
                except (asyncio.CancelledError, GeneratorExit):
                    self.core.metrics.on_rpc(name, "CANCELLED", None)
                    raise
                finally:
                    if key is not None:
                        self.core.limits.close_stream(key)

            return stream_handler

        @functools.wraps(fn)
        async def unary_handler(
            self: _Base, request: Any, context: grpc.aio.ServicerContext
        ) -> Any:
            t0 = time.monotonic()
            try:
                principal, _ = await enter(self, request, context)
                try:
                    result = fn(self, request, principal)
                    if inspect.iscoroutine(result):  # an async def RPC
                        result = await result
                finally:
                    # No answer, an error included, before the journal entries it may
                    # report (the call's own, or any it read) are committed.
                    if not committed:
                        await self.core.durable()
                self.core.metrics.on_rpc(name, "OK", time.monotonic() - t0)
                return result
            except Exception as exc:
                self.core.metrics.on_rpc(name, _code(exc), time.monotonic() - t0)
                await self._abort(context, name, exc)
            except asyncio.CancelledError:
                self.core.metrics.on_rpc(name, "CANCELLED", time.monotonic() - t0)
                raise

        return unary_handler

    return deco


def _code(exc: Exception) -> str:
    """The status code an exception is answered with (INTERNAL: one with no row)."""
    row = row_for(exc)
    return row.code.name if row is not None else "INTERNAL"


class _Base:
    service_name = ""

    def __init__(self, core: ServiceCore) -> None:
        self.core = core

    async def _abort(self, context: grpc.aio.ServicerContext, method: str, exc: Exception) -> None:
        status = status_for(exc)
        if status is None:
            log.exception("%s.%s failed", self.service_name, method)
            raise exc
        row = row_for(exc)
        assert row is not None
        self.core.metrics.rpc_errors.labels(method, row.code.name).inc()
        await context.abort_with_status(status)


class BrokerServicer(_Base):
    """``bursar.v1.Broker``: what campaigns call."""

    service_name = "bursar.v1.Broker"

    @_rpc(committed=True)
    async def Acquire(self, req: pb.AcquireRequest, who: Principal) -> pb.AcquireResponse:
        args = convert.acquire_from_proto(req, who.acting_for(req.campaign))
        grant, waited = await self.core.acquire(args)  # committed: no other wait (_rpc)
        allocation = self.core.runtime.backend.allocation(grant.lease_id)
        return pb.AcquireResponse(
            lease=convert.granted_lease_to_proto(self.core.engine, grant, allocation),
            tokens=grant.tokens,
            price=grant.price,
            credits=grant.credits,
            waited_s=waited,
        )

    @_rpc()
    def Renew(self, req: pb.RenewRequest, who: Principal) -> pb.RenewResponse:
        self.core.own_lease(who, req.lease_id)
        renewed = self.core.renew(req.lease_id, req.duration_s)
        return pb.RenewResponse(
            lease=self.core.lease_proto(req.lease_id),
            tokens=renewed.tokens,
            credits=renewed.credits,
        )

    @_rpc()
    def Release(self, req: pb.ReleaseRequest, who: Principal) -> pb.ReleaseResponse:
        self.core.own_lease(who, req.lease_id)
        lease, already, tokens, credits = self.core.release(req.lease_id)
        return pb.ReleaseResponse(
            lease=lease, already_ended=already, refund_tokens=tokens, refund_credits=credits
        )

    @_rpc()
    def GetLease(self, req: pb.GetLeaseRequest, who: Principal) -> pb.Lease:
        self.core.own_lease(who, req.lease_id)
        return self.core.lease_proto(req.lease_id)

    @_rpc()
    def ListLeases(self, req: pb.ListLeasesRequest, who: Principal) -> pb.ListLeasesResponse:
        return pb.ListLeasesResponse(leases=self.core.list_leases(who, req.campaign))

    @_rpc()
    def ListPending(self, req: pb.ListPendingRequest, who: Principal) -> pb.ListPendingResponse:
        return self.core.list_pending(who, req.campaign, req.request_id, req.idempotency_key)

    @_rpc(stream=True)
    async def Watch(
        self, req: pb.WatchRequest, who: Principal
    ) -> AsyncIterator[pb.LeaseEvent | _Headers]:
        if len(req.lease_ids) > 1000:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "lease_ids", "at most 1000 leases")
        sub = self.core.watch(who, req.campaign, req.lease_ids, req.from_seq, req.from_index)
        resume = self.core.runtime.journal.last_seq + 1
        yield _Headers(((RESUME_METADATA, str(resume)),))
        try:
            for ev in sub.snapshot:
                yield ev
            if sub.finished:
                return
            while (ev := await sub.next()) is not None:
                yield ev
        finally:
            self.core.unwatch(sub)

    @_rpc()
    def GetSupply(self, req: pb.SupplyRequest, who: Principal) -> pb.Supply:
        units = convert.check_number(req.units, "units")
        return self.core.supply_proto(who, units, req.dim)

    @_rpc(stream=True)
    async def WatchSupply(
        self, req: pb.WatchSupplyRequest, who: Principal
    ) -> AsyncIterator[pb.Supply]:
        low = convert.check_number(req.min_interval_s, "min_interval_s", high=3600) or 1.0
        high = convert.check_number(req.max_interval_s, "max_interval_s", high=3600) or 30.0
        low = max(low, 0.05)
        high = max(high, low)
        units = convert.check_number(req.units, "units")
        opened_with = self.core.token_generation(who.campaign)
        while True:
            if self.core.closing:
                raise ShuttingDown("the stream")
            self.core.check_token_generation(who.campaign, opened_with)
            yield self.core.supply_proto(who, units, req.dim)
            sent = time.monotonic()
            await self.core.supply_changed(high)
            rest = low - (time.monotonic() - sent)
            if rest > 0:
                await asyncio.sleep(rest)

    @_rpc()
    def Meter(self, req: pb.MeterRequest, who: Principal) -> pb.MeterResponse:
        campaign = who.acting_for(req.campaign)
        if not req.dim:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "dim", "required: fs_bw or inference")
        d = self.core.meter(campaign, req.dim, req.amount)
        return pb.MeterResponse(requested=d.requested, granted=d.granted, wait_s=d.wait_s)

    @_rpc()
    def ListDecisions(
        self, req: pb.ListDecisionsRequest, who: Principal
    ) -> pb.ListDecisionsResponse:
        limit = req.limit or 100
        if limit > 1000:
            raise RequestError(ErrorCode.INVALID_ARGUMENT, "limit", "at most 1000")
        kinds = set()
        for k in req.kinds:
            if k not in _KIND_BY_PROTO:
                raise RequestError(ErrorCode.INVALID_ARGUMENT, "kinds", f"unknown kind {k}")
            kinds.add(_KIND_BY_PROTO[k])
        rows, next_seq = self.core.list_decisions(
            who,
            start_seq=req.start_seq,
            campaign=req.campaign,
            kinds=kinds,
            lease_id=req.lease_id,
            since=convert.check_number(req.since, "since"),
            limit=limit,
        )
        out = pb.ListDecisionsResponse(next_seq=next_seq)
        out.decisions.extend(convert.decision_record(seq, d) for seq, _index, d in rows)
        return out

    @_rpc(admin_for=lambda req: "WhatIf of an envelope" if req.HasField("envelope") else "")
    async def WhatIf(self, req: pb.WhatIfRequest, who: Principal) -> pb.WhatIfResponse:
        change = req.WhichOneof("change")
        if change == "acquire":
            args = convert.acquire_from_proto(req.acquire, who.acting_for(req.acquire.campaign))
            outcome, engine = await self.core.what_if_acquire(args)
        elif change == "envelope":
            spec = convert.spec_from_proto(req.envelope)  # the admin's alone (admin_for)
            outcome, engine = await self.core.what_if_update(spec)
        else:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT, "change", "required: an acquire or an envelope"
            )
        own = outcome.own
        assert own is not None, outcome
        out = pb.WhatIfResponse(outcome=convert.decision_kind_to_proto(own.kind))
        if isinstance(own, Granted):
            out.lease.CopyFrom(convert.lease_to_proto(engine, engine.leases[own.lease_id]))
        elif isinstance(own, Queued):
            out.reason = convert.reason_to_proto(own.reason)
            out.estimated_wait_s = own.estimated_wait_s
        elif isinstance(own, Rejected):
            out.reason = convert.reason_to_proto(own.reason)
            out.estimated_wait_s = own.retry_after_s
        for d in outcome.decisions:
            record = codec.to_dict(d)
            # As ListDecisions filters a campaign token's: its own campaign's decisions only.
            if who.admin or record.get("campaign") == who.campaign:
                out.decisions.append(convert.decision_record(0, record))
        return out

    @_rpc()
    def GetStatus(self, req: pb.GetStatusRequest, who: Principal) -> pb.Status:
        core = self.core
        shared = core.topology is not None
        return status_message(
            core.engine,
            version=core.version,
            now=core.now(),
            started_at=core.started_at,
            journal_entries=core.runtime.journal.last_seq,
            open_streams=core.limits.open_streams,
            caller=str(who),
            role="leader" if shared else "single",
            topology=core.topology,
        )


def status_message(
    eng: Engine,
    *,
    version: str,
    now: float,
    started_at: float,
    journal_entries: int,
    open_streams: int,
    caller: str,
    role: str,
    topology: Topology | None,
) -> pb.Status:
    """The Status a broker answers: the leader's (or a single broker's) from its core, a
    standby's from the engine it follows (``server._Gate``). ``topology``: the brokers on a
    shared journal as last read from the store; None on SQLite."""
    out = pb.Status(
        version=version,
        now=now,
        engine_now=eng.now,
        started_at=started_at,
        journal_entries=journal_entries,
        campaigns=len(eng.campaigns),
        leases=len(eng.leases) - len(eng.elastic.parent_of),
        pending=len(eng.pending),
        open_streams=open_streams,
        caller=caller,
        role=role,
        journal_store="sqlite" if topology is None else "postgresql",
    )
    if topology is not None:
        out.leader = topology.leader
        out.epoch = topology.epoch
        out.brokers.extend(
            pb.JournalBroker(
                address=p.address,
                role=p.role,
                applied=p.applied,
                lag_entries=p.lag_entries,
                lag_s=p.lag_s,
                reported_at=p.reported_at,
            )
            for p in topology.brokers
        )
    return out


class AdminServicer(_Base):
    """``bursar.v1.Admin``: campaigns and their tokens; the admin token only."""

    service_name = "bursar.v1.Admin"

    def _campaign(self, name: str) -> admin_pb2.Campaign:
        core = self.core
        return convert.campaign_to_proto(core.engine, name, core.now(), core.tokens.issued_at(name))

    @_rpc(admin=True)
    def CreateCampaign(
        self, req: admin_pb2.CreateCampaignRequest, who: Principal
    ) -> admin_pb2.CreateCampaignResponse:
        spec = convert.spec_from_proto(req.spec)
        token = self.core.create_campaign(spec)
        return admin_pb2.CreateCampaignResponse(campaign=self._campaign(spec.name), token=token)

    @_rpc(admin=True)
    def UpdateCampaign(
        self, req: admin_pb2.UpdateCampaignRequest, who: Principal
    ) -> admin_pb2.Campaign:
        spec = convert.spec_from_proto(req.spec)
        self.core.update_campaign(spec)
        return self._campaign(spec.name)

    @_rpc(admin=True)
    def GetCampaign(self, req: admin_pb2.GetCampaignRequest, who: Principal) -> admin_pb2.Campaign:
        self.core.require_campaign(req.name)
        return self._campaign(req.name)

    @_rpc(admin=True)
    def ListCampaigns(
        self, req: admin_pb2.ListCampaignsRequest, who: Principal
    ) -> admin_pb2.ListCampaignsResponse:
        names = sorted(self.core.engine.campaigns)
        return admin_pb2.ListCampaignsResponse(campaigns=[self._campaign(n) for n in names])

    @_rpc(admin=True)
    def RotateToken(
        self, req: admin_pb2.RotateTokenRequest, who: Principal
    ) -> admin_pb2.RotateTokenResponse:
        token, at = self.core.rotate_token(req.campaign)
        return admin_pb2.RotateTokenResponse(token=token, issued_at=at)

    @_rpc(admin=True)
    def RevokeLease(self, req: admin_pb2.RevokeLeaseRequest, who: Principal) -> pb.Lease:
        return self.core.revoke(req.lease_id, req.reason)

    @_rpc(admin=True)
    def ApplyPolicy(
        self, req: admin_pb2.ApplyPolicyRequest, who: Principal
    ) -> admin_pb2.ApplyPolicyResponse:
        which = req.WhichOneof("policy")
        if which == "spec_json":
            policy = policy_apply.from_json(req.spec_json)
        elif which == "toml":
            policy = policy_apply.from_toml(req.toml, self.core.engine.policy)
        else:
            raise RequestError(
                ErrorCode.INVALID_ARGUMENT,
                "policy",
                "required: the new policy, as spec_json (every setting, the journal's "
                "spelling) or toml (a [policy] table)",
            )
        done = self.core.apply_policy(policy, req.dry_run)
        return admin_pb2.ApplyPolicyResponse(
            changes=[
                admin_pb2.PolicyChange(key=k, old_json=codec.dumps(a), new_json=codec.dumps(b))
                for k, (a, b) in done.changes.items()
            ],
            applied=done.seq > 0,
            seq=done.seq,
            policy=self._policy(done.policy),
        )

    @_rpc(admin=True)
    def GetPolicy(self, req: admin_pb2.GetPolicyRequest, who: Principal) -> admin_pb2.Policy:
        return self._policy(self.core.engine.policy)

    def _policy(self, policy: PolicySpec) -> admin_pb2.Policy:
        return admin_pb2.Policy(
            spec_json=codec.dumps(spec_to_dict(policy)),
            changed_at=self.core.runtime.journal.policy_changed_at,
        )


def generic_handler(servicer: _Base, service: ServiceDescriptor) -> grpc.GenericRpcHandler:
    """Handlers for every method of ``service``, from its descriptor (the .proto)."""
    handlers = {}
    for method in service.methods:
        impl = getattr(servicer, method.name, None)
        if impl is None:
            raise TypeError(f"{type(servicer).__name__} does not implement {method.full_name}")
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            impl,
            request_deserializer=_safe(request.FromString),
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)
