"""Ray clusters of the tests' and benchmarks' own, beyond the session's plain head:
an autoscaling head on Ray's fake multi-node provider (worker nodes are extra raylets
on this machine, started and stopped by the autoscaler).

Everything runs on ports of its own and in the head's process session, so stopping
the head (``LocalHead.stop``) also ends the fake nodes; never ``ray stop``.
"""

from __future__ import annotations

from pathlib import Path

from service.cluster.local_cluster import LocalHead, start_head

HEAD_TYPE, WORKER_TYPE = "ray.head.default", "ray.worker.cpu"


def fake_autoscaling_config(*, worker_cpus: int = 1, max_workers: int = 2, idle_timeout_s: float = 6.0) -> dict:
    """A head with no CPUs and up to ``max_workers`` fake nodes of ``worker_cpus`` each.

    ``ray start`` hands the file to the autoscaler as it is (no ``ray up`` fills in
    defaults), so every top-level field is spelled out.
    """
    return {
        "cluster_name": "raydock-test-fake",
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_s / 60,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "available_node_types": {
            HEAD_TYPE: {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {
                # A small object store per fake node: they all share this machine's memory.
                "resources": {"CPU": worker_cpus, "object_store_memory": 150_000_000},
                "node_config": {},
                "min_workers": 0,
                "max_workers": max_workers,
            },
        },
        "head_node_type": HEAD_TYPE,
        "auth": {},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def start_fake_autoscaling_head(state_dir: Path, *, timeout: float = 180.0, **config) -> tuple[LocalHead, Path]:
    """The head and the autoscaler config file it runs with (for ``RAYDOCK_AUTOSCALER_CONFIG``)."""
    head = start_head(
        state_dir,
        num_cpus=0,
        timeout=timeout,
        autoscaling_config=fake_autoscaling_config(**config),
        # The autoscaler's loop period (default 5 s): nodes come and go sooner.
        env={"AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_USAGE_STATS_ENABLED": "0"},
    )
    return head, state_dir / "autoscaling.json"
