"""Generated code for the ``bursar.*`` proto packages (see ``bursar.protos.gen``)."""
