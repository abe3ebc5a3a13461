"""The class table (ccld.anomaly) is complete, and the places that used to spell the classes out read it."""

from __future__ import annotations

import dataclasses

from ccld.anomaly import CLASSES, AnomalyKind, Effect, Family, kinds_of, kinds_with
from ccld.producers.simulator.scenario import FAULT_FIELDS, HANG_KINDS, SLOW_KINDS
from ccld.streams.analysis.settings import AnalyzerSettings


def test_every_kind_has_one_row_that_names_itself() -> None:
    assert list(CLASSES) == list(AnomalyKind)
    for kind, row in CLASSES.items():
        assert row.kind is kind and kind.info is row
        assert row.title and row.root and row.action, kind


def test_precedence_orders_each_family_without_ties() -> None:
    for family in Family:
        ranks = [c.precedence for c in CLASSES.values() if c.family is family]
        assert sorted(ranks) == list(range(len(ranks))), family
    # S3 is S1 and S2 at once: the most specific slow class
    assert AnomalyKind.S3.info.precedence > max(AnomalyKind.S1.info.precedence, AnomalyKind.S2.info.precedence)


def test_hang_thresholds_are_real_settings_and_slowdowns_have_none() -> None:
    names = {f.name for f in dataclasses.fields(AnalyzerSettings)}
    for kind, row in CLASSES.items():
        if kind.is_hang:
            assert row.threshold_setting in names, kind
        else:
            assert row.threshold_setting is None, kind


def test_a_class_that_names_a_link_is_injected_on_a_link_with_a_peer() -> None:
    for kind, row in CLASSES.items():
        on_link = bool(row.effect & (Effect.LINK | Effect.LINK_STOP))
        assert row.names_link == on_link, kind
        assert ("peer" in row.fault_fields) == on_link, kind


def test_the_simulator_reads_its_kinds_and_fields_from_the_table() -> None:
    assert HANG_KINDS == kinds_of(Family.HANG) == ("H1", "H2", "H3")
    assert SLOW_KINDS == kinds_of(Family.SLOW) == ("S1", "S2", "S3")
    assert kinds_with(Effect.COMPUTE) == ("S1", "S3")
    for kind, row in CLASSES.items():
        assert FAULT_FIELDS[kind.value] == dict(row.fault_fields)
