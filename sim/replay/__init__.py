"""Trace replay: real job traces through the engine under several admission policies."""

from bursar.sim import accel

# The compiled profile (``make accel``), when it is built from this source.
accel.use(__name__, __path__)
