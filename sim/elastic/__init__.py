"""Elastic, deadline-aware leases on the ElasticFlow traces (``bursar sim elastic``): the
trace and throughput-curve reader (``trace``), the virtual-time runner on the real engine
(``runner``) and the comparison's table and figure (``report``)."""
