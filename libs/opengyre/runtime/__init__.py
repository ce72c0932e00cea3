"""Process-level plumbing: the embedded nats-server, ports, gRPC servers, services and their supervisor."""

from ._grpc import GrpcServer, abort_invalid, abort_status
from ._nats import EmbeddedNats, NatsServerMissing, nats_server_binary
from ._ports import free_port, port_is_free, wait_for_port
from ._service import SERVICE_CLASSES, Service, ServiceContext, all_projections, load_service, run_service
from ._supervisor import Stack, StackAlreadyRunning, read_stack_file, stack_alive

__all__ = [
    "SERVICE_CLASSES",
    "EmbeddedNats",
    "GrpcServer",
    "NatsServerMissing",
    "Service",
    "ServiceContext",
    "Stack",
    "StackAlreadyRunning",
    "abort_invalid",
    "abort_status",
    "all_projections",
    "free_port",
    "load_service",
    "nats_server_binary",
    "port_is_free",
    "read_stack_file",
    "run_service",
    "stack_alive",
    "wait_for_port",
]
