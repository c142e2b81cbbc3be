"""Every ``bursar`` command, one module per command group; ``bursar.cli.main:main`` is the
entry point. The commands parse their arguments and print; what they run lives in the
packages they drive."""
