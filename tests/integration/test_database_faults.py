"""MariaDB failures with a writer running: one 3-server Database on the three real nodes,
one fault of ``lab.database_faults.FAULTS`` per test, and after each the same
verdict — every acknowledged row on every server, never two servers acknowledging writes,
no volume that held data deleted (``run_fault``). The pod-delete fault runs in
``test_database_servers`` (with the scale-down that follows it). Write gaps are printed, not
asserted: numbers live in ``make bench-mariadb``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lab.database_faults import FAULTS, Lab, Outcome, lab_on, run_fault

from stateward_local.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def lab(real_cluster: LocalCluster) -> Iterator[Lab]:
    with lab_on(real_cluster, "mariadb-faults-operator") as lab:
        yield lab


def run(lab: Lab, fault: str) -> Outcome:
    outcome = run_fault(lab, FAULTS[fault])
    print(
        f"{fault}: {len(outcome.acknowledged)} writes acknowledged, none lost; longest gap"
        f" {outcome.downtime:.2f}s; acknowledged by {outcome.servers}"
    )
    return outcome


def test_a_frozen_replica_node_costs_no_failover_and_no_write(lab: Lab) -> None:
    run(lab, "replica-node-freeze")


def test_mariadbd_killed_in_the_primary_loses_no_acknowledged_write(lab: Lab) -> None:
    run(lab, "mariadbd-kill")


def test_a_frozen_primary_node_is_replaced_and_rejoins_as_a_replica_when_thawed(
    lab: Lab,
) -> None:
    outcome = run(lab, "primary-node-freeze")
    assert outcome.primary != outcome.old


def test_a_partitioned_primary_is_replaced_and_rejoins_as_a_replica_when_healed(
    lab: Lab,
) -> None:
    outcome = run(lab, "primary-node-partition")
    assert outcome.primary != outcome.old
