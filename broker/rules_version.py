"""The version of the engine's decision rules, and what each version changed.

A journal records the version it was written under; an audit or a replay by a build of
another version says so, since the same events may then give other decisions. The
version goes up only on purpose, with the journals it changes named in its entry below.
"""

from __future__ import annotations

RULES_VERSION = 12
"""The version of the decision rules. It goes up whenever a change can make the same
events give other decisions; a journal records the version it was written under, and an
audit by a build of another version says so (its decisions may differ). 2: the admission
pass leaves a request as it is when the pool refuses its bucket (its campaign's own limits
are looked at again when that campaign changes), reservation profiles read firm lease ends
and guaranteed holdings as they were when built, and a batch campaign may take its lent
reserve back from a lease already draining for another request. 3: a campaign's requests
waiting on its own limits behind its head that waits for the pool are looked at again
whenever the campaign changes (they were left waiting for good). 4: a request larger than
the pool can ever give it beside the other campaigns' guarantees is refused at once, and an
envelope change that would leave a waiting request so is refused (such requests waited for
good, neither granted nor refused). 5: a pass that tries a changed campaign's head moves its
walk over the pool-blocked requests on past that head, so a request it passed over before
the head (for its bucket or for the reservations) is not tried again after a grant later in
the same pass, out of its turn. 6: a campaign's burst at or above the pool's capacity in a
dimension binds nothing there (``CampaignState.burst_bound``): a request above it is
pool-blocked, ages and keeps its turn, instead of waiting on its own campaign's limits
(where a later request of its campaign could hold the reservation and start first). 7:
an elastic lease renewed after some of its extra steps were announced to end keeps those
steps until their announced end (before, they ended at the lease's old expiry,
unannounced). 8: an intent's measured curve is known at its points only (a lease runs at
the speed of the largest measured count at or below its size; linear interpolation is the
intent's ``speed_model: interpolated``); an intent may name the sizes it can use, and the
allocator grows and shrinks a lease a jump at a time between them (the best gain per step
of every larger allowed size, so a lease crosses a plateau of its curve); and a renewal of
an elastic lease before its deadline is not refused for pushing a reservation (its
``Renewed`` says ``deadline_promise``). 9: an idempotency key is forgotten once the policy's
``idempotency_keys_kept`` newer keyed requests came (200,000 by default; or up to a chunk
of 100 later), as well as at the end of its window (``idempotency_window_s``, a day by
default): a retry after that many newer keys is a new request (before, a day of keys was
kept whatever their number). 10: elastic admission control plans over time: a deadline
request is admitted when a plan keeps its deadline and every admitted elastic lease's
(earliest deadline first, each on its fewest units over time, filling what the earlier
ones leave: ``elastic.admission_plan``), where before the units each needed held from now
had to fit side by side (a request that fits only after an earlier deadline's job is done
was refused); a refusal names the binding deadline (``plan`` in its inputs). Under
``dmug`` the allocator makes room at once for every waiting request the extra steps can
serve (in admission order), not one request per grace period, and while shrinks are in
flight a lease whose deadline is lost at its size still takes steps from leases that meet
theirs (counting what is free and announced for the earlier deadlines first). 11: under a
power cap a firm request reclaims watts from preemptible leases, as it reclaims nodes: where
the cap is what refuses it, it warns preemptible leases in the reclaim order until their
watts make up what it is short, takes none of their nodes, and starts when they end
(``pool_side.watt_victims``); and a reclaim's victims hand their watts over to the claimant,
which draws nothing until they have ended (before, both were counted until then, so a
reclaim under a tight cap needed room for both). Changes journals only where a power cap is
set and preemptible leases hold watts. 12: an elastic lease grows by one extent per allowed
size a jump crosses (a lease of the engine's own holding every step between two allowed
sizes, placed, charged and renewed as one), where before each step was a lease of its own:
a shrink to the next allowed size below ends the youngest extent, and a lost node that
leaves extents not making an allowed size at each one ends the younger ones too. Changes
journals only where an intent's allowed sizes are more than one step apart (measured
curves, ``sizes`` and ``size_rule``); where every whole step is allowed (Amdahl, the
interpolated model) an extent is a step and nothing changes."""

__all__ = ["RULES_VERSION"]
