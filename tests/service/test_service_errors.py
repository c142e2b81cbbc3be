"""The one exception → status table: one test per row, then each code triggered for real.

``test_row`` raises each row's example exception inside an RPC wrapped by the same
decorator the real servicers use, on a real server, and checks the status and
google.rpc details a client receives. The tests after it reach the same rows through
the engine and the service's own checks.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from service_support import POOL, START, config, fails, run, serve, until

from bursar.broker.clock import ManualClock
from bursar.broker.errors import ErrorCode, JournalError, RequestError
from bursar.broker.reasons import Reason
from bursar.broker.service import errors as E
from bursar.broker.service.auth import Principal
from bursar.broker.service.limits import LimitSettings
from bursar.broker.service.servicer import _Base, _rpc
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb

# One example exception per row, keyed by the row's key.
EXAMPLES: dict[str, BaseException] = {
    **{
        f"RequestError:{code.value}": RequestError(code, "size.gpu", f"bad ({code.value})")
        for code in ErrorCode
    },
    **{f"Refused:{r.value}": E.Refused(r, 2.5, campaign="sci", request_id="L7") for r in Reason},
    "Unauthenticated": E.Unauthenticated("MISSING_TOKEN", "no credentials"),
    "PermissionDenied": E.PermissionDenied("ADMIN_ONLY", "admin only", "campaign:sci"),
    "RateLimited": E.RateLimited(0.25, "peer:127.0.0.1", 10, 20),
    "TooManyStreams": E.TooManyStreams("token:abc", 4),
    "StreamOverflow": E.StreamOverflow(10_000),
    "ShuttingDown": E.ShuttingDown(),
    "JournalError": JournalError("disk full"),
}

# What each row must give: (status code, ErrorInfo.reason, retry-after or None, extra detail).
EXPECTED: dict[str, tuple[grpc.StatusCode, str, float | None, str | None]] = {
    "RequestError:INVALID_ARGUMENT": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_ARGUMENT",
        None,
        "bad_request",
    ),
    "RequestError:NOT_FOUND": (grpc.StatusCode.NOT_FOUND, "NOT_FOUND", None, None),
    "RequestError:ALREADY_EXISTS": (grpc.StatusCode.ALREADY_EXISTS, "ALREADY_EXISTS", None, None),
    "RequestError:FAILED_PRECONDITION": (
        grpc.StatusCode.FAILED_PRECONDITION,
        "FAILED_PRECONDITION",
        None,
        None,
    ),
    "RequestError:OUT_OF_RANGE": (
        grpc.StatusCode.OUT_OF_RANGE,
        "OUT_OF_RANGE",
        None,
        "bad_request",
    ),
    "Refused:ABOVE_BURST": (grpc.StatusCode.RESOURCE_EXHAUSTED, "ABOVE_BURST", 2.5, "quota"),
    "Refused:BUCKET_EMPTY": (grpc.StatusCode.RESOURCE_EXHAUSTED, "BUCKET_EMPTY", 2.5, "quota"),
    "Refused:GUARANTEE_RESERVED": (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "GUARANTEE_RESERVED",
        2.5,
        None,
    ),
    "Refused:POOL_FULL": (grpc.StatusCode.RESOURCE_EXHAUSTED, "POOL_FULL", 2.5, None),
    "Refused:HEAD_OF_LINE": (grpc.StatusCode.RESOURCE_EXHAUSTED, "HEAD_OF_LINE", 2.5, None),
    "Refused:LEASE_PREEMPTING": (
        grpc.StatusCode.FAILED_PRECONDITION,
        "LEASE_PREEMPTING",
        None,
        None,
    ),
    "Refused:DEADLINE_UNREACHABLE": (
        grpc.StatusCode.FAILED_PRECONDITION,
        "DEADLINE_UNREACHABLE",
        None,
        None,
    ),
    "Unauthenticated": (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN", None, None),
    "PermissionDenied": (grpc.StatusCode.PERMISSION_DENIED, "ADMIN_ONLY", None, None),
    "RateLimited": (grpc.StatusCode.RESOURCE_EXHAUSTED, "RATE_LIMITED", 0.25, "quota"),
    "TooManyStreams": (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS", None, None),
    "StreamOverflow": (grpc.StatusCode.RESOURCE_EXHAUSTED, "STREAM_OVERFLOW", 0.0, None),
    "ShuttingDown": (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", 1.0, None),
    "JournalError": (grpc.StatusCode.UNAVAILABLE, "JOURNAL_FAILED", 5.0, None),
}


def test_the_table_covers_every_engine_code_and_reason_and_each_row_is_tested() -> None:
    keys = {row.key for row in E.TABLE}
    assert len(keys) == len(E.TABLE), "duplicate rows"
    assert {f"RequestError:{c.value}" for c in ErrorCode} <= keys
    assert {f"Refused:{r.value}" for r in Reason} <= keys
    assert keys == set(EXAMPLES) == set(EXPECTED)
    for key, exc in EXAMPLES.items():
        row = E.row_for(exc)
        assert row is not None and row.key == key


def test_an_exception_without_a_row_has_no_status() -> None:
    assert E.status_for(ZeroDivisionError()) is None


class _Raiser(_Base):
    """A servicer with one RPC that raises whatever the test puts in ``self.raises``."""

    service_name = "test.Raiser"
    raises: BaseException | None = None

    @_rpc()
    def GetStatus(self, req: pb.GetStatusRequest, who: Principal) -> pb.Status:
        assert self.raises is not None
        raise self.raises


@pytest.mark.parametrize("key", [row.key for row in E.TABLE])
def test_row(tmp_path: Path, key: str) -> None:
    code, reason, retry, extra = EXPECTED[key]

    async def scenario() -> None:
        async with serve(tmp_path) as c:
            raiser = _Raiser(c.core)
            raiser.raises = EXAMPLES[key]
            # Added before start would be cleaner; grpc.aio also takes generic handlers late.
            handler = grpc.method_handlers_generic_handler(
                "test.Raiser",
                {
                    "GetStatus": grpc.unary_unary_rpc_method_handler(
                        raiser.GetStatus,
                        request_deserializer=pb.GetStatusRequest.FromString,
                        response_serializer=pb.Status.SerializeToString,
                    )
                },
            )
            c.running.server.add_generic_rpc_handlers((handler,))
            call = c.channel.unary_unary(
                "/test.Raiser/GetStatus",
                request_serializer=pb.GetStatusRequest.SerializeToString,
                response_deserializer=pb.Status.FromString,
            )
            d = await fails(call(pb.GetStatusRequest(), metadata=c.as_("sci")))
            assert d.code == code
            assert d.reason == reason and d.domain == "bursar.v1"
            assert d.message == E.rpc_status_for(EXAMPLES[key], E.row_for(EXAMPLES[key])).message
            if retry is None:
                assert d.retry_after_s is None
            else:
                assert d.retry_after_s == pytest.approx(retry, abs=1e-6)
            assert bool(d.field_violations) == (extra == "bad_request")
            assert bool(d.quota) == (extra == "quota")
            if extra == "bad_request":
                assert d.field_violations[0][0] == "size.gpu"

    run(scenario())


# --------------------------------------------------------------------------- for real

# Three warm nodes (24 GPUs), no cold one; `reserved` has an unmet guarantee of 8 GPUs, so
# 8 warm GPUs are kept for it; `thrifty` has no sustained rate and a small bucket.
TIGHT = (
    POOL.replace("[pool.groups.c]\ncount = 1\nwarm = 0", "[pool.groups.c]\ncount = 1\nwarm = 1")
    + """
[campaigns.sci]
[campaigns.sci.gpu]
sustained = 8
burst = 24
bucket = 100000

[campaigns.reserved]
[campaigns.reserved.gpu]
guarantee = 8
sustained = 8
burst = 8
bucket = 100000

[campaigns.thrifty]
[campaigns.thrifty.gpu]
burst = 16
bucket = 1000

[campaigns.backfill]
class = "opportunistic"
preemptible = true
[campaigns.backfill.gpu]
sustained = 24
burst = 24
"""
)


def test_engine_refusals_and_request_errors_reach_the_client_with_details(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, config(TIGHT)) as c:
            before = c.journal_len()
            # INVALID_ARGUMENT from the engine, with the field.
            d = await fails(
                c.broker.Acquire(
                    pb.AcquireRequest(size={"gpus": 1}, duration_s=10), metadata=c.as_("sci")
                )
            )
            assert d.code == grpc.StatusCode.INVALID_ARGUMENT and d.metadata["field"] == "size"
            assert "unknown dimension" in d.field_violations[0][1]
            # OUT_OF_RANGE: more than the pool.
            d = await fails(c.acquire("sci", 100))
            assert d.code == grpc.StatusCode.OUT_OF_RANGE and d.metadata["field"] == "size.gpu"
            # NOT_FOUND: no such lease.
            d = await fails(
                c.broker.GetLease(pb.GetLeaseRequest(lease_id="L999"), metadata=c.as_("sci"))
            )
            assert d.code == grpc.StatusCode.NOT_FOUND
            # ALREADY_EXISTS: a campaign name taken.
            spec = pb.CampaignSpec(name="sci")
            d = await fails(
                c.admin.CreateCampaign(
                    admin_pb2.CreateCampaignRequest(spec=spec), metadata=c.as_("admin")
                )
            )
            assert d.code == grpc.StatusCode.ALREADY_EXISTS
            # FAILED_PRECONDITION: guarantees above the pool.
            spec = pb.CampaignSpec(name="greedy")
            spec.envelopes["gpu"].guarantee = 24
            spec.envelopes["gpu"].burst = 24
            d = await fails(
                c.admin.CreateCampaign(
                    admin_pb2.CreateCampaignRequest(spec=spec), metadata=c.as_("admin")
                )
            )
            assert d.code == grpc.StatusCode.FAILED_PRECONDITION
            # INVALID_ARGUMENT: a name with a trailing newline, on create and on update.
            for rpc, req in (
                (c.admin.CreateCampaign, admin_pb2.CreateCampaignRequest),
                (c.admin.UpdateCampaign, admin_pb2.UpdateCampaignRequest),
            ):
                d = await fails(rpc(req(spec=pb.CampaignSpec(name="a\n")), metadata=c.as_("admin")))
                assert d.code == grpc.StatusCode.INVALID_ARGUMENT, d
            assert c.journal_len() == before  # refused requests journal nothing

            # OUT_OF_RANGE: all 24 GPUs can never be sci's beside reserved's guarantee of 8.
            d = await fails(c.acquire("sci", 24))
            assert d.code == grpc.StatusCode.OUT_OF_RANGE
            assert "beside the other campaigns' guarantees" in d.message
            assert "ask for at most 16" in d.message
            assert c.journal_len() == before
            # GUARANTEE_RESERVED: with 8 held, 16 more would fit the 16 free GPUs, but 8 of
            # them are kept for `reserved`.
            held = await c.acquire("sci", 8)
            d = await fails(c.acquire("sci", 16))
            assert d.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert d.reason == "GUARANTEE_RESERVED" and d.retry_after_s is not None
            assert d.metadata["campaign"] == "sci" and d.metadata["request_id"].startswith("L")
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=held.lease.lease_id), metadata=c.as_("sci")
            )
            # ABOVE_BURST: thrifty's burst (16) is below the pool's 24 GPUs: 8 held, 16 more
            # would pass it. (sci's burst is the whole pool, so it binds nothing the pool
            # does not: sci waits for the pool instead.)
            small = await c.acquire("thrifty", 8, duration_s=10)
            d = await fails(c.acquire("thrifty", 16, duration_s=10))
            assert d.reason == "ABOVE_BURST" and d.quota == [
                ("campaign:thrifty", Reason.ABOVE_BURST.explanation)
            ]
            await c.broker.Release(
                pb.ReleaseRequest(lease_id=small.lease.lease_id), metadata=c.as_("thrifty")
            )
            await c.acquire("sci", 16)
            # POOL_FULL: the reserved campaign fills its guarantee; nothing is left.
            await c.acquire("reserved", 8)
            d = await fails(c.acquire("thrifty", 1, duration_s=10))
            assert d.reason == "POOL_FULL" and d.retry_after_s >= 0.5

    run(scenario())


def test_bucket_empty_and_lease_preempting(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path, config(TIGHT)) as c:
            # BUCKET_EMPTY: 8 GPUs above a zero sustained rate for 100 s prepay 800 of the
            # bucket's 1000; a second such lease cannot be prepaid.
            await c.acquire("thrifty", 8, duration_s=100)
            d = await fails(c.acquire("thrifty", 8, duration_s=100))
            assert d.code == grpc.StatusCode.RESOURCE_EXHAUSTED and d.reason == "BUCKET_EMPTY"
            assert d.retry_after_s > 1 and d.quota

            # LEASE_PREEMPTING: renewing a lease that is being reclaimed.
            back = await c.acquire("backfill", 8)
            claim = await c.acquire("sci", 8)
            assert claim.lease.path == pb.LEASE_PATH_RECLAIM
            d = await fails(
                c.broker.Renew(
                    pb.RenewRequest(lease_id=back.lease.lease_id, duration_s=60),
                    metadata=c.as_("backfill"),
                )
            )
            assert d.code == grpc.StatusCode.FAILED_PRECONDITION
            assert d.reason == "LEASE_PREEMPTING" and d.retry_after_s is None

    run(scenario())


def test_rate_limit_and_stream_limit(tmp_path: Path) -> None:
    async def scenario() -> None:
        limits = LimitSettings(rate=4, burst=4, max_streams=2)
        clock = ManualClock(START)
        async with serve(tmp_path, limits=limits, clock=clock) as c:

            async def status() -> pb.GetStatusResponse:
                return await c.broker.GetStatus(pb.GetStatusRequest(), metadata=c.as_("sci"))

            for _ in range(4):
                await status()
            d = await fails(status())
            assert d.code == grpc.StatusCode.RESOURCE_EXHAUSTED and d.reason == "RATE_LIMITED"
            assert d.retry_after_s == 0.25  # one request's worth at 4 a second
            # The bucket refills on the service's clock: 0.25 s later, one more call.
            clock.advance(0.25)
            await status()
            clock.advance(0.125)  # half a request's worth
            d = await fails(status())
            assert d.reason == "RATE_LIMITED" and d.retry_after_s == 0.125
            # Another client (token) has its own budget.
            await c.broker.GetStatus(pb.GetStatusRequest(), metadata=c.as_("other"))

        async with serve(
            tmp_path / "streams", limits=LimitSettings(rate=100, burst=100, max_streams=2)
        ) as c:
            open_ = [c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci")) for _ in range(2)]
            for s in open_:
                await s.initial_metadata()
            third = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci"))
            d = await fails(third.read())
            assert d.code == grpc.StatusCode.RESOURCE_EXHAUSTED and d.reason == "TOO_MANY_STREAMS"
            open_[0].cancel()
            await until(lambda: c.core.limits.open_streams < 2)
            again = c.broker.Watch(pb.WatchRequest(), metadata=c.as_("sci"))
            await again.initial_metadata()
            assert c.core.limits.open_streams == 2

    run(scenario())


def test_an_error_quotes_a_large_bad_value_only_in_part(tmp_path: Path) -> None:
    # A 20 KB dimension name, far below the 1 MiB request limit: the reply names the field
    # and says what is wrong, but cut short, so that its trailers stay within the client's
    # metadata limit (else it would arrive as RESOURCE_EXHAUSTED, not INVALID_ARGUMENT).
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            before = c.journal_len()
            huge = "x" * 20_000
            d = await fails(
                c.broker.Acquire(
                    pb.AcquireRequest(size={huge: 1}, duration_s=10), metadata=c.as_("sci")
                )
            )
            assert d.code == grpc.StatusCode.INVALID_ARGUMENT, d
            assert "unknown dimension" in d.message and "(20,0" in d.message
            assert len(d.message) <= E.QUOTE_MAX
            assert all(len(v) <= E.QUOTE_MAX for v in d.metadata.values())
            assert all(len(x) <= E.QUOTE_MAX for fv in d.field_violations for x in fv)
            assert c.journal_len() == before

    run(scenario())
