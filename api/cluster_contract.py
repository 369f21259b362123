"""The names the server and the code it runs on the cluster share: the driver's
environment, the entrypoint modules and the warm pool's actors.

The server writes these (``service/attempts.py``, ``service/cluster/``) and the cluster
side reads them (``trainers/``, ``tuning/``); neither spells them itself
(tests/test_architecture.py). What the launch file holds is typed in
``api.schemas.launch``. Standard library only, and nothing imported at all: the warm-start
client (``trainers.zygote.client``) imports this on every job's start.
"""

from __future__ import annotations

# --- the driver's environment, set by the server in the Ray job's runtime_env. Nothing
# secret: Ray's job list shows these to every job on the cluster.

# The URI of the attempt's launch file (``api.schemas.launch.LaunchFile``), under the job's prefix.
LAUNCH_URI_ENV = "RAYDOCK_LAUNCH_URI"
# The sha256 of that file's bytes as the server wrote them: jobs can write the storage, so
# the driver refuses a launch file whose bytes differ.
LAUNCH_SHA256_ENV = "RAYDOCK_LAUNCH_SHA256"
# Where a training attempt finds its preemption marker (service/scheduling/preemption.py, trainers/preemption.py).
PREEMPT_URI_ENV = "RAYDOCK_PREEMPT_URI"
# How long a node's warm pool waits for a job before it exits; read by the cold driver
# that starts the pool, and by the pool itself.
WARM_IDLE_ENV = "RAYDOCK_WARM_IDLE_S"
# How long a search may go with every trial waiting while one could run (tuning/stall.py).
SEARCH_STALL_ENV = "RAYDOCK_SEARCH_STALL_S"

# --- set by a job's own runtime_env, read on the cluster.

# "0"/"false" in a job's environment: its driver always starts cold.
WARM_START_ENV = "RAYDOCK_WARM_START"

# --- the node-local dataset cache (trainers/data/cache.py), set by the server in every
# job's environment: its cap in bytes ("0": off) and its directory (empty: a default
# under the node's temporary directory).
DATA_CACHE_BYTES_ENV = "RAYDOCK_DATA_CACHE_BYTES"
DATA_CACHE_DIR_ENV = "RAYDOCK_DATA_CACHE_DIR"

# --- a driver run by hand, without a launch file, reads the job's facts from these.

JOB_ID_ENV = "RAYDOCK_JOB_ID"
SPEC_ENV = "RAYDOCK_JOB_SPEC"
STORAGE_PATH_ENV = "RAYDOCK_STORAGE_PATH"
EVENTS_URL_ENV = "RAYDOCK_EVENTS_URL"
EVENTS_TOKEN_ENV = "RAYDOCK_EVENTS_TOKEN"

# --- between the processes of one node, on the cluster side only.

# Set by the warm-start client for the cold driver it execs: start this node's pool at that socket.
WARM_SOCKET_ENV = "RAYDOCK_WARM_POOL_SOCKET"

# Every environment name above: the server and the cluster's code spell none of them.
ENV_NAMES = (
    LAUNCH_URI_ENV,
    LAUNCH_SHA256_ENV,
    PREEMPT_URI_ENV,
    WARM_IDLE_ENV,
    WARM_START_ENV,
    JOB_ID_ENV,
    SPEC_ENV,
    STORAGE_PATH_ENV,
    EVENTS_URL_ENV,
    EVENTS_TOKEN_ENV,
    WARM_SOCKET_ENV,
    DATA_CACHE_BYTES_ENV,
    DATA_CACHE_DIR_ENV,
)

# --- what the server submits: the modules Ray runs on the cluster.

DRIVER_MODULES = {"train": "trainers.driver", "tune": "tuning.search_driver"}
# Forks the driver from the node's warm process, or execs the cold driver (trainers/zygote/).
WARM_CLIENT_MODULE = "trainers.zygote.client"
# What a search trial's trainable asks the node's warm process to run: its local ranks' forker.
RANK_HOST_MODULE = "trainers.zygote.rank_host"
WORKER_SETUP_HOOK = "trainers.worker_setup.setup"

# --- the warm pool: one detached supervisor actor per node, named exactly
# ``raydock-warm-<node id>`` in this namespace, printing its facts
# (``api.schemas.launch.WarmPoolFacts``) as one ``RAYDOCK_WARM_POOL {json}`` line on its stdout.

WARM_NAMESPACE = "raydock"
WARM_NAME_PREFIX = "raydock-warm-"
WARM_FACTS_PREFIX = "RAYDOCK_WARM_POOL "


def warm_actor_name(node_id: str) -> str:
    """The name of the warm pool's supervisor actor on node ``node_id`` (hex)."""
    return WARM_NAME_PREFIX + node_id


# --- the dataset cache's keeper: one detached actor per node, named exactly
# ``raydock-datacache-<node id>`` in the warm pool's namespace, printing the cache's facts
# (``api.schemas.launch.DataCacheFacts``) as one ``RAYDOCK_DATA_CACHE {json}`` line on its stdout.

DATA_CACHE_NAME_PREFIX = "raydock-datacache-"
DATA_CACHE_FACTS_PREFIX = "RAYDOCK_DATA_CACHE "


def data_cache_actor_name(node_id: str) -> str:
    """The name of the dataset cache's keeper actor on node ``node_id`` (hex)."""
    return DATA_CACHE_NAME_PREFIX + node_id
