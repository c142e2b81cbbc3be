"""What ``bursar config check`` prints about a config: its nodes, its capacity beside the
campaigns' guarantees, and its campaigns' envelopes, as rich tables."""

from __future__ import annotations

from rich import box
from rich.table import Table

from bursar.broker import dims
from bursar.broker.config import Config, pool_capacity

__all__ = ["summary_tables"]


def _num(x: float | None) -> str:
    if x is None:
        return "unlimited"
    # Exact below a million (budgets people compare digit by digit); bucket sizes in the
    # millions of unit-seconds read better, and fit, as 3.84M.
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.6g}"


def summary_tables(cfg: Config) -> list[Table]:
    """Three tables: the node groups, the capacity per dimension beside the guarantees,
    and each campaign's envelope."""
    pool, policy = cfg.pool, cfg.policy

    nodes = Table(title="Nodes", title_justify="left")
    nodes.add_column("group (names)")
    nodes.add_column("count", justify="right")
    nodes.add_column("warm", justify="right")
    for d in dims.PLACED:
        nodes.add_column(f"{d} / node", justify="right")
    for g in pool.groups:
        names = f"{g.prefix}{0:03d}..{g.prefix}{g.count - 1:03d}"
        nodes.add_row(
            names,
            str(g.count),
            str(g.warm),
            *(_num(g.resources.get(d, 0.0)) for d in dims.PLACED),
        )
    nodes.caption = (
        f"boot latency {_num(pool.boot_latency_s)} s, grace {_num(policy.grace_s)} s, "
        f"enforcement {policy.enforcement.value}"
    )

    cap = pool_capacity(pool)
    capacity = Table(title="Capacity", title_justify="left")
    capacity.add_column("dimension")
    capacity.add_column("kind")
    capacity.add_column("capacity", justify="right")
    capacity.add_column("guarantees", justify="right")
    capacity.add_column("warm headroom", justify="right")
    capacity.add_column("unit")
    for d in dims.ALL:
        guaranteed = sum(c.envelopes[d].guarantee for c in cfg.campaigns if d in c.envelopes)
        capacity.add_row(
            d,
            "placed" if d in dims.PLACED else "rate",
            _num(cap[d]),
            _num(guaranteed),
            _num(policy.warm_headroom[d]) if d in policy.warm_headroom else "-",
            dims.UNITS[d],
        )

    # Compact layout so that the widest demo row fits an 80-column terminal or pipe.
    campaigns = Table(
        title="Campaigns",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
        show_edge=False,
    )
    campaigns.add_column("campaign")
    campaigns.add_column("class")
    campaigns.add_column("dim")
    for col in ("guarantee", "sustained", "burst", "bucket"):
        campaigns.add_column(col, justify="right")
    for c in cfg.campaigns:
        # One block per campaign: name and class on its first row, the flag on the second.
        labels = [c.name, c.lease_class.value]
        flags = ["", "preemptible" if c.preemptible else ""]
        present = [d for d in dims.ALL if d in c.envelopes]
        for k, d in enumerate(present):
            e = c.envelopes[d]
            head = labels if k == 0 else flags if k == 1 else ["", ""]
            campaigns.add_row(
                *head,
                d,
                _num(e.guarantee),
                _num(e.sustained),
                _num(e.burst),
                _num(e.bucket),
                end_section=k == len(present) - 1,
            )
        if len(present) < 2 and c.preemptible:
            campaigns.add_row("", "preemptible", "", "", "", "", "", end_section=True)
    if not cfg.campaigns:
        campaigns.caption = "no campaigns: they can be created at run time"
    return [nodes, capacity, campaigns]
