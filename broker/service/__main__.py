"""``python -m bursar.broker.service [OPTIONS]``: the same as ``bursar serve``."""

from bursar.cli.serve import serve_command

if __name__ == "__main__":
    serve_command(prog_name="python -m bursar.broker.service")
