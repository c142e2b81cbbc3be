"""broker"""

# Before any of the package's modules loads: BURSAR_ACCEL may put compiled ones in their place.
from bursar.broker import accel as _accel

_accel.activate()
