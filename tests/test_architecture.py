"""The layout is a test: imports flow one way, no module imports itself back, the
contract stays light, Ray internals have one seam, modules stay small, the names the
server and the cluster share are spelled only in ``api.cluster_contract``, the
server's background work is periodic units run by ``service.background`` (no thread or
sleeping loop of its own elsewhere), the events' writers and reads never import each
other, the server reads its environment only through ``service.settings``, and the rigs
(bench/, tests/) import one way: a benchmark imports no test, a test no benchmark but the
shared harness (bench/harness/), the product no rig;
and one composition root (``service.runtime``) builds the server's parts and hands each its
collaborators by name.

Imports are read from the source (lazy imports inside functions too), so a circle
stitched with a late import is still a circle. The checks are functions of a source
tree (tests/support/architecture.py); tests/test_architecture_planted.py runs them on
small trees with planted violations, to show they fail when they should.
"""

from __future__ import annotations

import functools

from tests.support.architecture import (
    PACKAGES,
    RIGS,
    ROOT,
    background_loops,
    composition_violations,
    contract_literals,
    cycles,
    environment_reads,
    event_side_violations,
    layering_violations,
    long_modules,
    model_specific_imports,
    ray_internals_outside_seam,
    rig_imports,
    room_violations,
)
from tests.support.source_tree import Tree, read_tree


@functools.cache
def checkout(*packages: str) -> Tree:
    """The checkout's modules, parsed once for all the checks below (which only read them)."""
    return read_tree(ROOT, packages)


# ----------------------------------------------------------------------------- the house


def test_no_import_cycles():
    assert cycles(checkout(*PACKAGES)) == []


def test_packages_import_one_way_and_the_contract_stays_light():
    assert layering_violations(checkout(*PACKAGES)) == []


def test_ray_internals_only_behind_the_seam():
    assert ray_internals_outside_seam(checkout(*PACKAGES)) == []


def test_parallel_strategies_name_no_model():
    assert model_specific_imports(checkout(*PACKAGES)) == []


def test_each_room_of_the_server_keeps_its_rule():
    assert room_violations(checkout(*PACKAGES)) == []


def test_no_module_over_the_line_limit():
    assert long_modules(checkout(*PACKAGES, *RIGS)) == []


def test_benchmarks_import_no_test_and_the_product_no_rig():
    assert rig_imports(checkout(*PACKAGES, *RIGS)) == []


def test_the_cluster_contract_is_spelled_in_one_place():
    assert contract_literals(checkout(*PACKAGES)) == []


def test_background_work_runs_only_as_periodic_units():
    assert background_loops(checkout(*PACKAGES)) == []


def test_the_events_writers_and_reads_keep_apart():
    assert event_side_violations(checkout(*PACKAGES)) == []


def test_the_server_reads_its_environment_through_settings():
    assert environment_reads(checkout(*PACKAGES)) == []


def test_http_app_lives_on_the_server_side():
    tree = checkout(*PACKAGES)
    assert not [
        m for m in tree.imports if m.startswith("api.") and m.split(".")[1] in ("app", "routes", "deps", "http")
    ]
    assert "service.http.app" in tree.imports


def test_one_composition_root_builds_the_parts():
    assert composition_violations(checkout(*PACKAGES)) == []
