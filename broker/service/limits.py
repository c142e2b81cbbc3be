"""Per-client limits: a token bucket on request rate, and a cap on open streams.

A client is its token (by SHA-256 prefix) when it sends one, else its peer host; so
every campaign's processes share one budget, and an unauthenticated flood is limited by
address. Both limits run on the event loop only (no locks). The buckets refill on the
service's clock, so a test with a manual clock sees exact refill times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bursar.broker.clock import SYSTEM, Clock
from bursar.broker.service.auth import digest
from bursar.broker.service.errors import RateLimited, TooManyStreams

__all__ = ["ClientLimits", "LimitSettings", "client_key"]


@dataclass(frozen=True, slots=True)
class LimitSettings:
    rate: float = 200.0
    """Requests per second each client may sustain (every call and stream open counts)."""
    burst: float = 400.0
    """Requests a client may send at once after being idle."""
    max_streams: int = 32
    """Streams (Watch, WatchSupply) a client may hold open at once."""


def client_key(token: str | None, peer: str, digest: Callable[[str], str] = digest) -> str:
    """``token:<digest prefix>`` for a client with a token, ``peer:<host>`` otherwise.
    ``digest``: the token store's cached one, on the service's path."""
    if token is not None:
        return "token:" + digest(token)[:16]
    # "ipv4:127.0.0.1:5555", "ipv6:[::1]:5555", "unix:/path": drop the port.
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        rest = rest.rsplit(":", 1)[0]
    return f"peer:{rest or peer}"


class ClientLimits:
    def __init__(self, settings: LimitSettings, clock: Clock = SYSTEM) -> None:
        self.settings = settings
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}
        self._streams: dict[str, int] = {}
        self._calls = 0

    def admit(self, key: str) -> None:
        """Take one request from ``key``'s bucket, or raise RateLimited with a retry-after."""
        s = self.settings
        now = self._clock.now()
        level, at = self._buckets.get(key, (s.burst, now))
        # max(0, ...): the wall clock may step back; that must not drain a bucket.
        level = min(s.burst, level + max(0.0, now - at) * s.rate)
        if level < 1.0:
            self._buckets[key] = (level, now)
            raise RateLimited((1.0 - level) / s.rate, key, s.rate, s.burst)
        self._buckets[key] = (level - 1.0, now)
        self._calls += 1
        if self._calls % 4096 == 0:
            self._prune(now)

    def open_stream(self, key: str) -> None:
        n = self._streams.get(key, 0)
        if n >= self.settings.max_streams:
            raise TooManyStreams(key, self.settings.max_streams)
        self._streams[key] = n + 1

    def close_stream(self, key: str) -> None:
        n = self._streams.get(key, 0) - 1
        if n > 0:
            self._streams[key] = n
        else:
            self._streams.pop(key, None)

    @property
    def open_streams(self) -> int:
        return sum(self._streams.values())

    def _prune(self, now: float) -> None:
        # A bucket that has refilled is the same as no bucket: forget idle clients.
        s = self.settings
        full = [k for k, (lvl, at) in self._buckets.items() if lvl + (now - at) * s.rate >= s.burst]
        for k in full:
            del self._buckets[k]
