"""Campaign behaviours as agent programs (``bursar.workflows``), written once against the
small ``Ctx`` interface (``api``) so that they run in virtual time in the simulator
(``bursar.sim.runner.SimCtx``) and against a live broker over gRPC (``grpc_ctx.GrpcCtx``):
the agents (``agents``) and the science task model (``tasks``)."""
