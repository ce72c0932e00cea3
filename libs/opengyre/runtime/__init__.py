"""Process-level plumbing: the embedded nats-server, ports, gRPC servers, services and their supervisor."""

from ._grpc import GrpcServer, abort_invalid, abort_status
from ._lock import DataDirBusy, DataDirLock, DataDirUnusable, check_data_dir, describe_holder
from ._nats import EmbeddedNats, NatsServerMissing, is_nats_server_of, nats_server_binary
from ._ports import free_port, port_is_free, wait_for_port
from ._procs import alive, cmdline, spawn, stop_group
from ._service import (
    SERVICE_CLASSES,
    Service,
    ServiceContext,
    all_projections,
    load_service,
    projection_owners,
    run_service,
)
from ._supervisor import (
    Leftover,
    PortTaken,
    ServiceFailed,
    Stack,
    find_leftovers,
    is_service_of,
    lock_holder,
    read_stack_file,
    reap_leftovers,
    stack_alive,
)

__all__ = [
    "SERVICE_CLASSES",
    "DataDirBusy",
    "DataDirLock",
    "DataDirUnusable",
    "EmbeddedNats",
    "GrpcServer",
    "Leftover",
    "NatsServerMissing",
    "PortTaken",
    "Service",
    "ServiceContext",
    "ServiceFailed",
    "Stack",
    "abort_invalid",
    "abort_status",
    "alive",
    "all_projections",
    "check_data_dir",
    "cmdline",
    "describe_holder",
    "find_leftovers",
    "free_port",
    "is_nats_server_of",
    "is_service_of",
    "load_service",
    "lock_holder",
    "nats_server_binary",
    "port_is_free",
    "projection_owners",
    "read_stack_file",
    "reap_leftovers",
    "run_service",
    "spawn",
    "stack_alive",
    "stop_group",
    "wait_for_port",
]
