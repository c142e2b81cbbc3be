"""Ray: an autoscaler node provider on Bursar leases."""
