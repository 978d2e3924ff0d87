"""Server configuration: the TOML file format and its typed form."""

from laneway.config.parse import load_config, parse_config
from laneway.config.schema import (
    BatchConfig,
    ClusterConfig,
    ServerConfig,
    TenantConfig,
    WorkerConfig,
    hash_key,
    is_loopback,
)

__all__ = [
    "BatchConfig",
    "ClusterConfig",
    "ServerConfig",
    "TenantConfig",
    "WorkerConfig",
    "hash_key",
    "is_loopback",
    "load_config",
    "parse_config",
]
