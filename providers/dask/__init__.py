"""Dask: `BursarCluster`, a lease-backed cluster manager."""
