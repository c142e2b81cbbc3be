"""Trace replay: real job traces through the engine under several admission policies."""

# Decides, before any replay module loads, whether the compiled ones stand in for them.
import bursar.broker  # noqa: F401
