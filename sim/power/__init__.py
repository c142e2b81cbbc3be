"""Power as a measured quantity: node and job draw, a GPU power limit's cost in run time,
and a facility's draw over a schedule (``model``); the readers of the measurements it is
built from (``readers``)."""
