"""`ccld verdicts`: the line format (detection time and job first) and the job, class and state filters."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from ccld.cli import main as ccld_main
from ccld.records import AnomalyKind, VerdictState
from ccld.streams.tail import VerdictFilter, format_line, parse_kinds, parse_states, utc_seconds
from factories import make_verdict


def verdict(**over: Any) -> Any:
    base: dict[str, Any] = dict(job="train-7", detected_time=1_760_000_007.9, root_cause_ranks=(13,))
    base.update(over)
    return make_verdict(**base)


def test_a_line_starts_with_the_utc_detection_time_to_the_second_and_the_job() -> None:
    v = verdict()
    assert format_line(v) == f"2025-10-09T08:53:27Z job=train-7 {v.describe()}"
    assert utc_seconds(0.0) == "1970-01-01T00:00:00Z"


def test_no_filter_shows_everything() -> None:
    show = VerdictFilter()
    assert show(verdict()) and show(verdict(kind=AnomalyKind.S1, state=VerdictState.RESOLVED, job="x"))


def test_job_kind_and_state_filters_combine() -> None:
    show = VerdictFilter(jobs=frozenset({"train-7"}), kinds=frozenset({AnomalyKind.H1, AnomalyKind.H3}),
                         states=frozenset({VerdictState.OPEN}))
    assert show(verdict())
    assert not show(verdict(job="train-8"))
    assert not show(verdict(kind=AnomalyKind.S2))
    assert not show(verdict(state=VerdictState.UPDATE))
    assert show(verdict(kind=AnomalyKind.H3))


def test_kinds_take_names_families_commas_and_any_case() -> None:
    assert parse_kinds(["h1,S2", "s3"]) == {AnomalyKind.H1, AnomalyKind.S2, AnomalyKind.S3}
    assert parse_kinds(["hang"]) == {AnomalyKind.H1, AnomalyKind.H2, AnomalyKind.H3}
    assert parse_kinds([]) == frozenset()
    with pytest.raises(argparse.ArgumentTypeError, match="unknown class 'H9'"):
        parse_kinds(["H9"])


def test_states_are_the_verdict_states() -> None:
    assert parse_states(["open,RESOLVED"]) == {VerdictState.OPEN, VerdictState.RESOLVED}
    with pytest.raises(argparse.ArgumentTypeError, match="unknown state 'gone'; one of open, update, resolved"):
        parse_states(["gone"])


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--kind", "H9", "argument --kind: unknown class 'H9'"),
    ("--state", "gone", "argument --state: unknown state 'gone'"),
    ("--broker-timeout-s", "0", "argument --broker-timeout-s: must be positive"),
])
def test_bad_filters_are_refused_before_any_broker_is_asked(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        ccld_main(["verdicts", "--bootstrap", "127.0.0.1:9", flag, value])
    assert exc.value.code == 2 and message in capsys.readouterr().err
