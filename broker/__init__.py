"""broker"""

from bursar.broker import compiled

# The compiled elastic allocator (``make accel``), when it is built from this source.
compiled.use(__name__, __path__)
