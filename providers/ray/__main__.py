"""``python -m bursar.providers.ray check CLUSTER.yaml``: see :mod:`bursar.providers.ray.check`."""

import sys

from bursar.providers.ray.check import main

sys.exit(main())
