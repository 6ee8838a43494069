"""The suite's own scheduling (tests/durations.py): longest first, and a shared unit's modules on one worker."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.durations import SHARED_UNITS, check_units, longest_first, scope_of, unit_of


@dataclass
class _Item:
    """What longest_first and check_units read of a pytest item."""

    nodeid: str
    fixturenames: tuple[str, ...] = ()


def test_the_ray_modules_are_one_unit_and_the_others_their_own() -> None:
    assert unit_of("tests/cluster/test_ray_shards.py") == "ray"
    assert unit_of("tests/indexer/test_ray_engine.py") == "ray"
    assert unit_of("tests/indexer/test_indexer.py") == "tests/indexer/test_indexer.py"
    assert unit_of("tests/clusterish/test_x.py") == "tests/clusterish/test_x.py"  # a folder, not a prefix


def test_a_unit_goes_out_at_its_summed_seconds_its_modules_in_collection_order() -> None:
    items = [_Item("tests/a.py::t1"), _Item("tests/cluster/test_ray_shards.py::t"), _Item("tests/b.py::t"),
             _Item("tests/indexer/test_ray_engine.py::t"), _Item("tests/a.py::t2")]
    record = {"tests/a.py": 50.0, "tests/b.py": 10.0, "tests/cluster/test_ray_shards.py": 30.0,
              "tests/indexer/test_ray_engine.py": 30.0}
    longest_first(items, record)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["tests/cluster/test_ray_shards.py::t", "tests/indexer/test_ray_engine.py::t",
                                         "tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t"]


def test_the_scheduler_gives_a_unit_one_scope_and_keeps_loadscope_elsewhere() -> None:
    assert scope_of("tests/cluster/test_ray_shards.py::test_x[1]") == "ray"
    assert scope_of("tests/indexer/test_ray_engine.py::test_y") == "ray"
    assert scope_of("tests/a.py::test_z") == "tests/a.py"
    assert scope_of("tests/a.py::Cls::test_z") == "tests/a.py::Cls"  # a class, as loadscope


def test_a_module_outside_the_unit_asking_for_its_fixture_is_refused_by_name() -> None:
    fixture = SHARED_UNITS["ray"][0]
    check_units([_Item("tests/cluster/test_ray_shards.py::t", (fixture,))])  # type: ignore[list-item]
    with pytest.raises(pytest.UsageError, match=r"tests/other\.py uses ray_cluster"):
        check_units([_Item("tests/other.py::t", (fixture,))])  # type: ignore[list-item]
