"""The ``bursar.v1`` wire contract: ``broker.proto`` and ``admin.proto`` and the modules
generated from them (``broker_pb2``, ``broker_pb2_grpc``, ``admin_pb2``, ``admin_pb2_grpc``).

Do not edit the generated modules; edit the ``.proto`` files and run
``scripts/gen_protos.sh``.
"""
