"""Generated protobuf and gRPC code of proto/opengyre/v1 (run `make proto`; never edit by hand)."""
