"""Settlement layer: the escrow contract's sources, compiler, deployment, binding and messages."""
