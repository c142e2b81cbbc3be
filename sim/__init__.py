"""The facility simulator (``bursar.sim``): a discrete-event kernel with a virtual clock
(``kernel``) that drives the same engine as the service, through ``Broker`` and the
simulated pool (``runner``); the agent-burst scenario and its metrics (``scenario``);
its report (``report``); and ``bursar sim run`` (``cli``)."""
