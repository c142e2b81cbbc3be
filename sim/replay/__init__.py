"""Trace replay: real job traces through the engine under several admission policies."""

from bursar.broker import compiled

# The compiled profile (``make accel``), when it is built from this source.
compiled.use(__name__, __path__)
