"""Who may do what: campaign tokens, the admin token, token storage, TLS, loopback."""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
from pathlib import Path

import grpc
import pytest
from common import self_signed_cert
from service_support import config, fails, md, run, serve

from bursar.broker.service.server import Settings, is_loopback, running
from bursar.protos.bursar.v1 import admin_pb2
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg


def test_a_campaign_token_cannot_touch_another_campaigns_leases(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            theirs = (await c.acquire("other", 8)).lease.lease_id
            before = c.journal_len()
            calls = [
                c.broker.GetLease(pb.GetLeaseRequest(lease_id=theirs), metadata=c.as_("sci")),
                c.broker.Renew(
                    pb.RenewRequest(lease_id=theirs, duration_s=60), metadata=c.as_("sci")
                ),
                c.broker.Release(pb.ReleaseRequest(lease_id=theirs), metadata=c.as_("sci")),
                c.broker.Acquire(
                    pb.AcquireRequest(campaign="other", size={"gpu": 1}, duration_s=10),
                    metadata=c.as_("sci"),
                ),
                c.broker.Meter(
                    pb.MeterRequest(campaign="other", dim="inference", amount=1),
                    metadata=c.as_("sci"),
                ),
                c.broker.ListLeases(pb.ListLeasesRequest(campaign="other"), metadata=c.as_("sci")),
                c.broker.ListDecisions(
                    pb.ListDecisionsRequest(campaign="other"), metadata=c.as_("sci")
                ),
            ]
            for call in calls:
                d = await fails(call)
                assert d.code == grpc.StatusCode.PERMISSION_DENIED, d
                assert d.reason == "OTHER_CAMPAIGN" and d.metadata["caller"] == "campaign:sci"
            watch = c.broker.Watch(pb.WatchRequest(lease_ids=[theirs]), metadata=c.as_("sci"))
            d = await fails(watch.read())
            assert d.code == grpc.StatusCode.PERMISSION_DENIED
            # Nothing changed, and the lease is still theirs and live.
            assert c.journal_len() == before
            assert c.core.engine.leases[theirs].campaign == "other"
            mine = await c.broker.ListLeases(pb.ListLeasesRequest(), metadata=c.as_("sci"))
            assert list(mine.leases) == []
            # The admin may act for any campaign, naming it.
            got = await c.broker.Acquire(
                pb.AcquireRequest(campaign="other", size={"gpu": 1}, duration_s=10),
                metadata=c.as_("admin"),
            )
            assert got.lease.campaign == "other"
            d = await fails(
                c.broker.Acquire(
                    pb.AcquireRequest(size={"gpu": 1}, duration_s=10), metadata=c.as_("admin")
                )
            )
            assert d.code == grpc.StatusCode.INVALID_ARGUMENT and d.metadata["field"] == "campaign"

    run(scenario())


def test_admin_calls_need_the_admin_token(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            spec = pb.CampaignSpec(name="sneaky")
            calls = {
                "CreateCampaign": lambda m: c.admin.CreateCampaign(
                    admin_pb2.CreateCampaignRequest(spec=spec), metadata=m
                ),
                "UpdateCampaign": lambda m: c.admin.UpdateCampaign(
                    admin_pb2.UpdateCampaignRequest(spec=pb.CampaignSpec(name="sci")), metadata=m
                ),
                "GetCampaign": lambda m: c.admin.GetCampaign(
                    admin_pb2.GetCampaignRequest(name="sci"), metadata=m
                ),
                "ListCampaigns": lambda m: c.admin.ListCampaigns(
                    admin_pb2.ListCampaignsRequest(), metadata=m
                ),
                "RotateToken": lambda m: c.admin.RotateToken(
                    admin_pb2.RotateTokenRequest(campaign="other"), metadata=m
                ),
            }
            before = c.journal_len()
            for name, call in calls.items():
                d = await fails(call(c.as_("sci")))
                assert d.code == grpc.StatusCode.PERMISSION_DENIED and d.reason == "ADMIN_ONLY", (
                    name
                )
                d = await fails(call(()))
                assert d.code == grpc.StatusCode.UNAUTHENTICATED and d.reason == "MISSING_TOKEN"
                d = await fails(call(md("bsr_not-a-real-token")))
                assert d.code == grpc.StatusCode.UNAUTHENTICATED and d.reason == "INVALID_TOKEN"
            assert c.journal_len() == before
            assert "sneaky" not in c.core.engine.campaigns
            # The other campaign's token still works (RotateToken was refused).
            assert (await c.acquire("other", 1)).lease.campaign == "other"

    run(scenario())


def test_missing_or_malformed_credentials_are_unauthenticated(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            req = pb.GetStatusRequest()
            d = await fails(c.broker.GetStatus(req))
            assert d.code == grpc.StatusCode.UNAUTHENTICATED and d.reason == "MISSING_TOKEN"
            d = await fails(c.broker.GetStatus(req, metadata=(("authorization", c.tokens["sci"]),)))
            assert d.code == grpc.StatusCode.UNAUTHENTICATED and d.reason == "MALFORMED_TOKEN"
            d = await fails(
                c.broker.GetStatus(req, metadata=(("authorization", "Basic dXNlcjpwYXNz"),))
            )
            assert d.reason == "MALFORMED_TOKEN"
            st = await c.broker.GetStatus(req, metadata=c.as_("admin"))
            assert st.caller == "admin"

    run(scenario())


def test_tokens_are_stored_hashed_and_handed_out_in_private_files(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serve(tmp_path) as c:
            assert set(c.tokens) == {"sci", "other", "backfill"}
            for name in ("tokens.json", "admin.token", "tokens.sqlite"):
                mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
                assert mode == 0o600, (name, oct(mode))
            raw = (tmp_path / "tokens.sqlite").read_bytes()
            for token in c.tokens.values():
                assert token.encode() not in raw
            with sqlite3.connect(tmp_path / "tokens.sqlite") as db:
                rows = dict(db.execute("SELECT campaign, sha256 FROM tokens"))
            assert set(rows) == set(c.tokens) and all(len(h) == 64 for h in rows.values())
            spec = pb.CampaignSpec(name="late")
            spec.envelopes["gpu"].burst = 1
            created = await c.admin.CreateCampaign(
                admin_pb2.CreateCampaignRequest(spec=spec), metadata=c.as_("admin")
            )
            # Tokens issued through the API are shown only in the response.
            assert "late" not in json.loads((tmp_path / "tokens.json").read_text())
            assert created.token not in (tmp_path / "tokens.sqlite").read_text(errors="ignore")

        # A restart issues nothing new: every campaign has a token.
        written = (tmp_path / "tokens.json").read_text()
        async with serve(tmp_path) as again:
            assert again.core.issued_at_start == ()
            assert (tmp_path / "tokens.json").read_text() == written
            assert (await again.acquire("sci", 1)).lease.campaign == "sci"

    run(scenario())


def test_admin_token_file(tmp_path: Path) -> None:
    secret = tmp_path / "admin-secret"
    secret.write_text("a-long-enough-admin-secret\n")

    async def scenario() -> None:
        async with serve(tmp_path / "state", admin_token_file=secret) as c:
            assert c.core.admin_token_path == secret
            assert not (tmp_path / "state" / "admin.token").exists()
            st = await c.broker.GetStatus(
                pb.GetStatusRequest(), metadata=md("a-long-enough-admin-secret")
            )
            assert st.caller == "admin"

    run(scenario())


def test_non_loopback_hosts_need_allow_remote(tmp_path: Path) -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")

    async def scenario() -> None:
        settings = Settings(state_dir=tmp_path, config=config(), host="0.0.0.0", port=0)
        with pytest.raises(ValueError, match="allow-remote"):
            async with running(settings):
                pass

    run(scenario())
    assert not (tmp_path / "journal.sqlite").exists()  # refused before touching anything


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls(tmp_path: Path) -> None:
    key, cert = self_signed_cert(tmp_path) or (None, None)
    assert key is not None and cert is not None

    async def scenario() -> None:
        async with serve(tmp_path / "state", tls_cert=cert, tls_key=key) as c:
            creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
            async with grpc.aio.secure_channel(c.address, creds) as ch:
                st = await pbg.BrokerStub(ch).GetStatus(
                    pb.GetStatusRequest(), metadata=c.as_("sci")
                )
                assert st.caller == "campaign:sci"
            # A plaintext client cannot talk to it.
            d = await fails(
                c.broker.GetStatus(pb.GetStatusRequest(), metadata=c.as_("sci"), timeout=2)
            )
            assert d.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

    run(scenario())
