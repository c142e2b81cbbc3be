"""``python -m bursar.providers.ray check CLUSTER.yaml`` (see
:mod:`bursar.providers.ray.check`) and ``python -m bursar.providers.ray start ...``
(``ray start`` on a loopback address, see :mod:`bursar.providers.ray.start`)."""

import sys

if sys.argv[1:2] == ["start"]:
    from bursar.providers.ray.start import main as start

    sys.exit(start(sys.argv[2:]))

from bursar.providers.ray.check import main

sys.exit(main())
