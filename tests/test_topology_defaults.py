"""Defaults that follow where the ranks sit: which layouts count as host by host, and the
decentralized mode's default schedule across hosts."""
import pytest

from ripples.runtime import hosts_node_by_node
from ripples.torch.decentralized_optimizer import schedule_kind


@pytest.mark.parametrize("node_of,expected", [
    ((0, 0, 2, 2, 4, 4, 6, 6), True),   # 4 hosts x 2 ranks, numbered host by host
    ((0, 0, 0, 3, 3, 3), True),         # 2 hosts x 3
    ((0, 0, 2, 3, 3), False),           # uneven slots (2, 1, 2)
    ((0, 0, 0, 0), False),              # one host
    ((0, 1, 2, 3), False),              # one rank per host: nothing to group within a host
    ((0, 1, 0, 1), False),              # placed round robin (--map-by node)
])
def test_hosts_node_by_node(node_of, expected):
    assert hosts_node_by_node(node_of) is expected


def test_the_default_schedule_is_node_aware_only_across_hosts_host_by_host():
    assert schedule_kind(False, None, hosts_node_by_node=True) == "generator-node"
    assert schedule_kind(False, None, hosts_node_by_node=False) == "generator"
    # A schedule the user names is kept, whatever the layout.
    assert schedule_kind(False, "generator", hosts_node_by_node=True) == "generator"
    assert schedule_kind(True, None, hosts_node_by_node=True) == "adpsgd"
    with pytest.raises(ValueError, match="schedule='ring' is not valid"):
        schedule_kind(False, "ring", hosts_node_by_node=True)
