"""The token and permission matrix over every RPC (from the proto descriptors), with TLS on
and off, and loopback-only binding.

Callers: no token, a malformed authorization header, a wrong token, a rotated (old) token,
another campaign's token, the target campaign's own token, the admin token, and the admin
naming something that does not exist. Each cell's expected code follows the documented
rules (broker.proto, admin.proto, the README's "Service" section):

* no or a malformed header: UNAUTHENTICATED; an unknown or rotated token: UNAUTHENTICATED;
* Admin RPCs: the admin token only (PERMISSION_DENIED for any campaign token);
* a campaign token acts for its own campaign only: naming another campaign, or touching its
  lease, is PERMISSION_DENIED; calls scoped to the caller (GetSupply, WatchSupply,
  GetStatus) are OK and see only its own campaign;
* the admin may act for any campaign by naming it; an unknown lease or campaign is
  NOT_FOUND.

The matrix runs over plaintext and over TLS (a self-signed certificate from openssl); a
plaintext client cannot reach the TLS server nor a TLS client the plaintext one. Binding:
a non-loopback --host without --allow-remote is refused before anything is created, and by
default the server listens on 127.0.0.1 only (its listening sockets, read from /proc).
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from common import Mode, Result, self_signed_cert
from fuzz import DrainedServer, Method, Outcome, call, methods
from google.protobuf.message import Message
from server import md

from bursar.protos.bursar.v1 import admin_pb2, admin_pb2_grpc
from bursar.protos.bursar.v1 import broker_pb2 as pb
from bursar.protos.bursar.v1 import broker_pb2_grpc as pbg

POOL = """
[pool]
boot_latency_s = 1.0
[pool.rate_capacity]
inference = 1000
[pool.groups.w]
count = 4
warm = 4
gpu = 8
cpu = 64
mem_gb = 512
[policy]
grace_s = 0.5
max_lease_s = 3600
[policy.warm_headroom]
gpu = 0
""" + "".join(
    f"""
[campaigns.{name}]
class = "batch"
[campaigns.{name}.gpu]
sustained = 8
burst = 16
bucket = 1000000
[campaigns.{name}.inference]
sustained = 100
burst = 200
"""
    for name in ("sci", "other", "spare")
)

CALLERS = ("none", "malformed", "wrong", "rotated", "other", "own", "admin", "admin-unknown")
"""Columns of the matrix. The target is campaign sci (its lease, its name)."""

OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
NOT_FOUND = grpc.StatusCode.NOT_FOUND

SCOPED = {"GetSupply", "WatchSupply", "GetStatus"}
"""Broker RPCs that name no campaign and no lease: answered for the caller's own campaign."""

UNKNOWN_TARGET = {
    "Acquire",
    "Renew",
    "Release",
    "GetLease",
    "Watch",
    "Meter",
    "ListPending",
    "GetCampaign",
    "UpdateCampaign",
    "RotateToken",
    "RevokeLease",
    "WhatIf",
}
"""RPCs whose target can be named and not exist (NOT_FOUND for the admin)."""

VARIANTS = {"WhatIf": ("envelope",)}
"""Second forms of an RPC with rules of their own, each a row of the matrix: WhatIf of an
envelope change is the admin's only, as Admin.UpdateCampaign (its Acquire form is the
RPC's own row)."""

ADMIN_VARIANTS = {("WhatIf", "envelope")}


def expected(caller: str, m: Method, variant: str = "") -> grpc.StatusCode | None:
    """The documented answer for a cell; None: the cell does not apply."""
    if caller in ("none", "malformed", "wrong", "rotated"):
        return UNAUTH
    if caller == "admin-unknown":
        if m.name not in UNKNOWN_TARGET:
            return None
        return NOT_FOUND
    if m.admin or (m.name, variant) in ADMIN_VARIANTS:
        return OK if caller == "admin" else DENIED
    if caller == "other":
        return OK if m.name in SCOPED else DENIED
    return OK


def _request(m: Method, caller: str, lease: str, fresh: str, variant: str = "") -> Message:
    """The request a cell sends: aimed at campaign sci, its lease ``lease``; for the admin
    naming the unknown, at a lease and campaign that do not exist."""
    unknown = caller == "admin-unknown"
    lid = "L999999" if unknown else lease
    camp = "nobody" if unknown else "sci"
    # A campaign token may leave `campaign` empty (its own); the admin must name one.
    named = camp if caller in ("admin", "admin-unknown", "other") else ""
    envelope = {"gpu": pb.DimEnvelope(sustained=8, burst=16, bucket=1_000_000)}
    build: dict[str, Callable[[], Message]] = {
        "Acquire": lambda: pb.AcquireRequest(
            campaign=named, size={"gpu": 1}, duration_s=60, timeout_s=0
        ),
        "Renew": lambda: pb.RenewRequest(lease_id=lid, duration_s=60),
        "Release": lambda: pb.ReleaseRequest(lease_id=lid),
        "GetLease": lambda: pb.GetLeaseRequest(lease_id=lid),
        "ListLeases": lambda: pb.ListLeasesRequest(campaign=named),
        "Watch": lambda: pb.WatchRequest(lease_ids=[lid]),
        "GetSupply": lambda: pb.SupplyRequest(units=1),
        "WatchSupply": lambda: pb.WatchSupplyRequest(min_interval_s=0.05),
        "Meter": lambda: pb.MeterRequest(campaign=named, dim="inference", amount=1),
        "ListDecisions": lambda: pb.ListDecisionsRequest(campaign=named, limit=5),
        "ListPending": lambda: pb.ListPendingRequest(campaign=named),
        "GetStatus": lambda: pb.GetStatusRequest(),
        "CreateCampaign": lambda: admin_pb2.CreateCampaignRequest(
            spec=pb.CampaignSpec(name=fresh, envelopes=envelope)
        ),
        "UpdateCampaign": lambda: admin_pb2.UpdateCampaignRequest(
            spec=pb.CampaignSpec(name=camp, envelopes=envelope)
        ),
        "GetCampaign": lambda: admin_pb2.GetCampaignRequest(name=camp),
        "ListCampaigns": lambda: admin_pb2.ListCampaignsRequest(),
        # Rotating sci's token would cut off the "own" column: rotate a fresh campaign.
        "RotateToken": lambda: admin_pb2.RotateTokenRequest(
            campaign="nobody" if unknown else fresh
        ),
        "RevokeLease": lambda: admin_pb2.RevokeLeaseRequest(lease_id=lid, reason="access matrix"),
        # A dry run of the policy in force: the admin's cell answers OK and changes nothing,
        # so the cells after it see the same broker.
        "ApplyPolicy": lambda: admin_pb2.ApplyPolicyRequest(toml="[policy]\n", dry_run=True),
        "GetPolicy": lambda: admin_pb2.GetPolicyRequest(),
        "WhatIf": lambda: pb.WhatIfRequest(
            acquire=pb.AcquireRequest(campaign=named, size={"gpu": 1}, duration_s=60)
        ),
        "WhatIf(envelope)": lambda: pb.WhatIfRequest(
            envelope=pb.CampaignSpec(name=camp, envelopes=envelope)
        ),
    }
    if variant:
        return build[f"{m.name}({variant})"]()
    if m.name not in build:
        raise KeyError(f"the access matrix has no request for {m.label}: add one")
    return build[m.name]()


class Matrix:
    """Runs the cells against one server over one channel."""

    def __init__(self, server: DrainedServer, channel: grpc.Channel, stale: str) -> None:
        self.channel = channel
        self.tokens = server.tokens()
        self.admin = server.admin()
        self.stale = stale
        self.cells = 0
        self._made = 0
        self._acquire = pbg.BrokerStub(channel).Acquire
        self._release = pbg.BrokerStub(channel).Release
        self._create = admin_pb2_grpc.AdminStub(channel).CreateCampaign

    def metadata(self, caller: str) -> tuple[tuple[str, str], ...]:
        return {
            "none": (),
            "malformed": (("authorization", self.tokens["sci"]),),  # no "Bearer "
            "wrong": md("bsr_" + "Z" * 43),
            "rotated": md(self.stale),
            "other": md(self.tokens["other"]),
            "own": md(self.tokens["sci"]),
            "admin": md(self.admin),
            "admin-unknown": md(self.admin),
        }[caller]

    def cell(self, m: Method, caller: str, variant: str = "") -> Outcome:
        self.cells += 1
        self._made += 1
        fresh = f"acc-{self._made}"
        lease = self._acquire(
            pb.AcquireRequest(campaign="sci", size={"gpu": 1}, duration_s=600),
            metadata=md(self.admin),
            timeout=10,
        ).lease.lease_id
        if m.name == "RotateToken":
            spec = pb.CampaignSpec(name=fresh)
            spec.envelopes["gpu"].burst = 1
            self._create(
                admin_pb2.CreateCampaignRequest(spec=spec), metadata=md(self.admin), timeout=10
            )
        try:
            body = _request(m, caller, lease, fresh, variant).SerializeToString()
            return call(self.channel, m, body, self.metadata(caller), timeout=5)
        finally:
            self._release(pb.ReleaseRequest(lease_id=lease), metadata=md(self.admin), timeout=10)


def _matrix(
    result: Result, server: DrainedServer, channel: grpc.Channel, stale: str, tag: str
) -> dict[str, dict[str, str]]:
    mx = Matrix(server, channel, stale)
    table: dict[str, dict[str, str]] = {}
    rows = [(m, v) for m in methods() for v in ("", *VARIANTS.get(m.name, ()))]
    for m, variant in rows:
        label = f"{m.label}({variant})" if variant else m.label
        row: dict[str, str] = {}
        for caller in CALLERS:
            want = expected(caller, m, variant)
            if want is None:
                row[caller] = "-"
                continue
            got = mx.cell(m, caller, variant)
            row[caller] = got.code.name if got.code == want else f"{got.code.name}!"
            if got.code != want:
                result.fail(
                    f"{tag}: {label} as {caller}: expected {want.name}, got {got.code.name} "
                    f"{got.reason} {got.message[:120]!r}"
                )
        table[label] = row
    result.figures[f"cells_{tag}"] = mx.cells
    return table


def _scoping(result: Result, server: DrainedServer, channel: grpc.Channel) -> None:
    """What a campaign token sees of the calls scoped to it: itself only."""
    admin, other = md(server.admin()), md(server.tokens()["other"])
    acquire = pbg.BrokerStub(channel).Acquire
    lease = acquire(
        pb.AcquireRequest(campaign="sci", size={"gpu": 1}, duration_s=600),
        metadata=admin,
        timeout=10,
    ).lease.lease_id

    def get(path: str, req: Message, resp: type[Message]) -> Any:
        return channel.unary_unary(
            path,
            request_serializer=type(req).SerializeToString,
            response_deserializer=resp.FromString,
        )(req, metadata=other, timeout=10)

    status = get("/bursar.v1.Broker/GetStatus", pb.GetStatusRequest(), pb.Status)
    supply = get("/bursar.v1.Broker/GetSupply", pb.SupplyRequest(), pb.Supply)
    leases = get("/bursar.v1.Broker/ListLeases", pb.ListLeasesRequest(), pb.ListLeasesResponse)
    decisions = get(
        "/bursar.v1.Broker/ListDecisions", pb.ListDecisionsRequest(), pb.ListDecisionsResponse
    )
    seen = {
        "caller": status.caller,
        "supply_campaigns": sorted(supply.campaigns),
        "leases_of": sorted({ls.campaign for ls in leases.leases}),
        "decisions_of": sorted({d.campaign for d in decisions.decisions}),
    }
    result.figures["other_sees"] = seen
    if (
        seen["caller"] != "campaign:other"
        or set(seen["supply_campaigns"]) - {"other"}
        or set(seen["leases_of"]) - {"other"}
        or set(seen["decisions_of"]) - {"other"}
        or lease in {ls.lease_id for ls in leases.leases}
    ):
        result.fail(f"campaign other's token sees more than its own: {seen}")


def _rotated(server: DrainedServer, channel: grpc.Channel) -> str:
    """Rotate campaign spare's token; the old one, which must stop working."""
    old = server.tokens()["spare"]
    admin_pb2_grpc.AdminStub(channel).RotateToken(
        admin_pb2.RotateTokenRequest(campaign="spare"), metadata=md(server.admin()), timeout=10
    )
    return old


def _status(channel: grpc.Channel, token: str) -> grpc.StatusCode:
    try:
        pbg.BrokerStub(channel).GetStatus(pb.GetStatusRequest(), metadata=md(token), timeout=3)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[attr-defined,no-any-return]
    return grpc.StatusCode.OK


def _listening(port: int) -> list[str]:
    """The local addresses of the sockets listening on ``port`` (from /proc/net)."""
    out = []
    for name, width in (("tcp", 8), ("tcp6", 32)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, state = cols[1], cols[3]
            hexaddr, hexport = local.split(":")
            if state != "0A" or int(hexport, 16) != port:
                continue
            raw = bytes.fromhex(hexaddr)
            if width == 8:
                out.append(socket.inet_ntop(socket.AF_INET, raw[::-1]))
            else:
                # /proc prints each 32-bit word of the IPv6 address in host order.
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                out.append(socket.inet_ntop(socket.AF_INET6, words))
    return out


def _non_loopback_ip() -> str | None:
    """An address of this host that is not loopback, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def run(mode: Mode, work_dir: Path) -> Result:
    del mode  # the matrix is the same size in both modes
    result = Result("access")
    cfg = work_dir / "access.toml"
    cfg.write_text(POOL)
    common = ("--config", str(cfg), "--rate-limit", "100000", "--rate-burst", "100000")
    tables: dict[str, dict[str, dict[str, str]]] = {}

    with DrainedServer(work_dir / "plain", *common) as server:
        with grpc.insecure_channel(server.address) as ch:
            stale = _rotated(server, ch)
            tables["plaintext"] = _matrix(result, server, ch, stale, "plaintext")
            _scoping(result, server, ch)
        # Binding: the default host is loopback, and only loopback listens.
        host, port = server.address.rsplit(":", 1)
        bound = _listening(int(port))
        result.figures["default_bound"] = bound
        if host != "127.0.0.1" or not bound or any(not _is_loopback(a) for a in bound):
            result.fail(f"the default server listens on {bound} (announced {server.address})")
        other_ip = _non_loopback_ip()
        if other_ip is not None:
            with socket.socket() as s:
                s.settimeout(2)
                reached = s.connect_ex((other_ip, int(port))) == 0
            result.figures["reachable_on_" + other_ip] = reached
            if reached:
                result.fail(f"the loopback-only server accepts connections on {other_ip}")
        tls_key_cert = self_signed_cert(work_dir)
        if tls_key_cert is not None:
            # A TLS client cannot talk to the plaintext server.
            creds = grpc.ssl_channel_credentials(root_certificates=tls_key_cert[1].read_bytes())
            with grpc.secure_channel(server.address, creds) as ch:
                code = _status(ch, server.admin())
            result.figures["tls_client_to_plaintext"] = code.name
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                result.fail(f"a TLS client got {code.name} from the plaintext server")

    if tls_key_cert is None:
        result.lines.append("TLS: skipped (no openssl command)")
        result.figures["tls"] = "skipped: no openssl"
    else:
        key, cert = tls_key_cert
        with DrainedServer(
            work_dir / "tls", *common, "--tls-cert", str(cert), "--tls-key", str(key)
        ) as server:
            creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
            with grpc.secure_channel(server.address, creds) as ch:
                stale = _rotated(server, ch)
                tables["tls"] = _matrix(result, server, ch, stale, "tls")
            with grpc.insecure_channel(server.address) as ch:
                code = _status(ch, server.admin())
            result.figures["plaintext_client_to_tls"] = code.name
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                result.fail(f"a plaintext client got {code.name} from the TLS server")

    # A non-loopback host without --allow-remote: refused, nothing created.
    refused_dir = work_dir / "remote"
    out = subprocess.run(
        [sys.executable, "-m", "bursar.broker.service", "--state-dir", str(refused_dir),
         "--config", str(cfg), "--host", "0.0.0.0", "--port", "0", "--no-metrics"],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    result.figures["non_loopback_exit"] = out.returncode
    if out.returncode != 2 or "allow-remote" not in out.stderr:
        result.fail(f"--host 0.0.0.0 without --allow-remote: exit {out.returncode} {out.stderr!r}")
    if refused_dir.exists() and any(refused_dir.iterdir()):
        result.fail("the refused start left state behind")

    result.figures["matrix"] = tables
    for tag, table in tables.items():
        run_cells = sum(v != "-" for r in table.values() for v in r.values())
        result.lines.append(f"{tag}: {run_cells} cells over {len(table)} RPCs ('-': no target)")
        width = max(len(k) for k in table)
        result.lines.append(f"  {'':<{width}}  " + " ".join(f"{c:>13}" for c in CALLERS))
        for name, row in table.items():
            result.lines.append(f"  {name:<{width}}  " + " ".join(f"{row[c]:>13}" for c in CALLERS))
    result.lines.append(
        f"default bind {result.figures['default_bound']}; --host 0.0.0.0 without "
        f"--allow-remote exits {out.returncode}"
    )
    return result


def _is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    # A dual-stack socket bound to 127.0.0.1 shows as ::ffff:127.0.0.1.
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback
