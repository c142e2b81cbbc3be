"""The Bursar client: what agents and workflow plugins (Parsl, Dask, Ray) talk to the
broker with.

Async first::

    from bursar.providers.client import AsyncBrokerClient, Refused

    async with AsyncBrokerClient("127.0.0.1:50051", token) as client:
        try:
            lease = await client.acquire({"gpu": 8}, duration_s=600, blocking=False)
        except Refused as exc:
            print(exc.reason, "retry in", exc.retry_after, "s")
        async with client.held_lease({"gpu": 8}, 600, on_preempt=drain) as h:
            await h.active.wait()
            ...  # renewed in the background; released on exit
        async for ev in client.watch():
            print(ev.kind, ev.lease.id)

and a synchronous facade for hosts that need one (:class:`BrokerClient`,
:class:`AdminClient`: a private event loop on a daemon thread behind the same
methods). Calls raise subclasses of :class:`BursarClientError`, mapped from the gRPC
status and its google.rpc details (ErrorInfo reason, RetryInfo delay). While the broker
is unreachable or restarting, calls and streams are retried with exponential backoff
and jitter (:class:`Backoff`, from a seedable RNG); a dropped Watch stream is reopened
and resumes where it was.
"""

from bursar.providers.client._aio import MAX_WAIT_S as MAX_WAIT_S
from bursar.providers.client._aio import AsyncAdminClient as AsyncAdminClient
from bursar.providers.client._aio import AsyncBrokerClient as AsyncBrokerClient
from bursar.providers.client._backoff import Backoff as Backoff
from bursar.providers.client._channel import DEFAULT_TARGET as DEFAULT_TARGET
from bursar.providers.client._channel import Tls as Tls
from bursar.providers.client._errors import AlreadyExists as AlreadyExists
from bursar.providers.client._errors import BursarClientError as BursarClientError
from bursar.providers.client._errors import DeadlineExceeded as DeadlineExceeded
from bursar.providers.client._errors import FailedPrecondition as FailedPrecondition
from bursar.providers.client._errors import FieldViolation as FieldViolation
from bursar.providers.client._errors import InvalidArgument as InvalidArgument
from bursar.providers.client._errors import NotFound as NotFound
from bursar.providers.client._errors import OutOfRange as OutOfRange
from bursar.providers.client._errors import PermissionDenied as PermissionDenied
from bursar.providers.client._errors import Refused as Refused
from bursar.providers.client._errors import Unauthenticated as Unauthenticated
from bursar.providers.client._errors import Unavailable as Unavailable
from bursar.providers.client._intent import Intent as Intent
from bursar.providers.client._lease import LeaseHandle as LeaseHandle
from bursar.providers.client._loop import LoopThread as LoopThread
from bursar.providers.client._policy import PolicyApplied as PolicyApplied
from bursar.providers.client._policy import PolicyChange as PolicyChange
from bursar.providers.client._policy import PolicyState as PolicyState
from bursar.providers.client._sync import AdminClient as AdminClient
from bursar.providers.client._sync import BrokerClient as BrokerClient
from bursar.providers.client._sync import SyncLeaseHandle as SyncLeaseHandle
from bursar.providers.client._token import InvalidToken as InvalidToken
from bursar.providers.client._token import check_token as check_token
from bursar.providers.client._token import read_token_file as read_token_file
from bursar.providers.client._types import BrokerStatus as BrokerStatus
from bursar.providers.client._types import Campaign as Campaign
from bursar.providers.client._types import CampaignSpec as CampaignSpec
from bursar.providers.client._types import CampaignSupply as CampaignSupply
from bursar.providers.client._types import CreatedCampaign as CreatedCampaign
from bursar.providers.client._types import DecisionKind as DecisionKind
from bursar.providers.client._types import DecisionRecord as DecisionRecord
from bursar.providers.client._types import DimEnvelope as DimEnvelope
from bursar.providers.client._types import DimSupply as DimSupply
from bursar.providers.client._types import ElasticState as ElasticState
from bursar.providers.client._types import JournalBroker as JournalBroker
from bursar.providers.client._types import Lease as Lease
from bursar.providers.client._types import LeaseClass as LeaseClass
from bursar.providers.client._types import LeaseEvent as LeaseEvent
from bursar.providers.client._types import LeaseEventKind as LeaseEventKind
from bursar.providers.client._types import LeasePath as LeasePath
from bursar.providers.client._types import LeaseState as LeaseState
from bursar.providers.client._types import MeterResult as MeterResult
from bursar.providers.client._types import PendingRequest as PendingRequest
from bursar.providers.client._types import PowerSupply as PowerSupply
from bursar.providers.client._types import ReasonCode as ReasonCode
from bursar.providers.client._types import Shape as Shape
from bursar.providers.client._types import Supply as Supply
from bursar.providers.client._types import TimeTo as TimeTo
from bursar.providers.client._types import WhatIfResult as WhatIfResult

__all__ = [
    "DEFAULT_TARGET",
    "MAX_WAIT_S",
    "AdminClient",
    "AlreadyExists",
    "AsyncAdminClient",
    "AsyncBrokerClient",
    "Backoff",
    "BrokerClient",
    "BrokerStatus",
    "BursarClientError",
    "Campaign",
    "CampaignSpec",
    "CampaignSupply",
    "CreatedCampaign",
    "DeadlineExceeded",
    "DecisionKind",
    "DecisionRecord",
    "DimEnvelope",
    "DimSupply",
    "ElasticState",
    "FailedPrecondition",
    "FieldViolation",
    "Intent",
    "InvalidArgument",
    "InvalidToken",
    "JournalBroker",
    "Lease",
    "LeaseClass",
    "LeaseEvent",
    "LeaseEventKind",
    "LeaseHandle",
    "LeasePath",
    "LeaseState",
    "LoopThread",
    "MeterResult",
    "NotFound",
    "OutOfRange",
    "PendingRequest",
    "PermissionDenied",
    "PolicyApplied",
    "PolicyChange",
    "PolicyState",
    "PowerSupply",
    "ReasonCode",
    "Refused",
    "Shape",
    "Supply",
    "SyncLeaseHandle",
    "TimeTo",
    "Tls",
    "Unauthenticated",
    "Unavailable",
    "WhatIfResult",
    "check_token",
    "read_token_file",
]
