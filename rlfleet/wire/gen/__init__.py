"""Generated protobuf and gRPC stubs (see rlfleet.wire.codegen)."""
