"""Power: booting nodes for the cold path and to keep capacity warm, powering idle ones off.

The guarantee reserve and the warm headroom must stay on powered (or booting) nodes, so
``keep_warm`` boots cold nodes whenever warm + booting capacity falls below them. A node
left idle for ``power_down_idle_s`` is powered off if the reserve and headroom stay warm
without it; each idle spell has its own timer, set when the spell starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from bursar.broker import dims
from bursar.broker.decisions import PoweredOff, PoweredOn
from bursar.broker.policy import PolicySpec
from bursar.broker.pool import NodeState, PoolState
from bursar.broker.timers import TimerKind


class PowerControl:
    """When each idle node's spell began, and the boots and power-offs that follow."""

    __slots__ = ("_boot_latency_s", "_idle_s", "_pool", "_push_timer", "headroom", "idle_check")

    def __init__(
        self,
        pool: PoolState,
        boot_latency_s: float,
        policy: PolicySpec,
        push_timer: Callable[[float, TimerKind, str], None],
    ) -> None:
        self._pool = pool
        self._boot_latency_s = boot_latency_s
        self._idle_s = policy.power_down_idle_s
        self._push_timer = push_timer
        self.headroom = dims.vec(policy.warm_headroom)
        """Warm capacity kept free beyond the guarantee reserve (preemptible work may not
        take it)."""
        self.idle_check: dict[int, float] = {}
        """Powered, unused nodes (by index) and when their idle spell's power-down check is
        due (kept, not derived from the spell's start: a policy change keeps the checks
        already set)."""

    def retune(self, policy: PolicySpec, now: float) -> None:
        """A new policy is in force: the headroom to keep warm, and the idle time before a
        power-down. Checks already set keep their times; turned off, they are dropped (the
        idle nodes stay on); turned on, every idle node starts a spell now."""
        self.headroom = dims.vec(policy.warm_headroom)
        was, self._idle_s = self._idle_s, policy.power_down_idle_s
        if self._idle_s is None:
            self.idle_check.clear()
        elif was is None:
            for i in range(len(self._pool.nodes)):
                self.watch_idle(i, now)

    def boot(
        self, need: dims.Vec, now: float, gate: Callable[[int], bool] | None = None
    ) -> PoweredOn | None:
        """Boot cold nodes to cover ``need`` (those ``gate`` lets boot, if given); the
        PoweredOn to send, if any node boots."""
        booted = self._pool.boot(need, now, self._boot_latency_s, gate)
        if not booted:
            return None
        nodes = self._pool.nodes
        return PoweredOn(now, tuple(nodes[i].name for i in booted), now + self._boot_latency_s)

    def boot_nodes(self, nodes: Iterable[int], now: float) -> PoweredOn | None:
        """Boot the given nodes that are cold (the cold pieces of a plan need them)."""
        booted = self._pool.boot_nodes(nodes, now, self._boot_latency_s)
        if not booted:
            return None
        names = self._pool.nodes
        return PoweredOn(now, tuple(names[i].name for i in booted), now + self._boot_latency_s)

    def keep_warm(
        self, reserve: dims.Vec, now: float, gate: Callable[[int], bool] | None = None
    ) -> PoweredOn | None:
        """Boot cold nodes when warm + booting capacity falls below reserve + headroom;
        ``gate``: which cold nodes the power cap lets boot (None: any)."""
        on_free, boot_free, cold, _ = self._pool.totals()
        target = dims.add(reserve, self.headroom)
        short = dims.vmax0(dims.sub(target, dims.add(on_free, boot_free)))
        if dims.is_zero(short) or dims.is_zero(cold):
            return None
        return self.boot(short, now, gate)

    def in_use(self, nodes: Iterable[int]) -> None:
        """The nodes got pieces: their idle spells (if any) end."""
        idle_check = self.idle_check
        for i in nodes:
            idle_check.pop(i, None)

    def watch_idle(self, i: int, now: float) -> None:
        """Start an idle spell for node ``i`` if it is powered and unused."""
        n = self._pool.nodes[i]
        if self._idle_s is not None and n.power is NodeState.ON and n.used == dims.ZERO:
            at = now + self._idle_s
            self.idle_check[i] = at
            self._push_timer(at, TimerKind.IDLE, n.name)

    def idle_check_at(self, name: str) -> float | None:
        """When the power-down check of the node's current idle spell is due (None: not
        idle)."""
        return self.idle_check.get(self._pool.index[name])

    def power_off_if_idle(self, name: str, reserve: dims.Vec, now: float) -> PoweredOff | None:
        """Power an idle node down if the warm reserve and headroom stay covered without it;
        otherwise start a new idle spell and look again after another ``power_down_idle_s``."""
        pool = self._pool
        i = pool.index[name]
        n = pool.nodes[i]
        if n.power is not NodeState.ON or n.used != dims.ZERO:
            return None
        on_free, _, _, _ = pool.totals()
        need = dims.add(reserve, self.headroom)
        # Only powered capacity counts: the reserve must be warm, not booting.
        if not dims.fits(need, dims.sub(on_free, n.cap)):
            self.watch_idle(i, now)
            return None
        pool.set_power(i, NodeState.COLD)
        del self.idle_check[i]
        return PoweredOff(now, (name,))

    def node_ready(self, i: int, now: float) -> None:
        self._pool.set_power(i, NodeState.ON)
        self.watch_idle(i, now)

    def node_lost(self, i: int) -> None:
        self.idle_check.pop(i, None)
        self._pool.set_power(i, NodeState.DOWN)
