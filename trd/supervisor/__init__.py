"""What runs in the supervisor process besides HTTP: the engine group and its keeper,
the requests in flight, and the deployment a config describes."""
