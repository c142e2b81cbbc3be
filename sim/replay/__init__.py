"""Trace replay: real job traces through the engine under several admission policies."""
