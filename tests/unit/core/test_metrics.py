"""The Prometheus text renderer (``ccld.metrics``) against exact text: counters, labelled gauges, histograms,
escaping, and the names it refuses."""

from __future__ import annotations

import math

import pytest

from ccld.metrics import Family, Histogram, escape_help, escape_label, format_value, render


def test_a_counter_renders_help_type_and_its_value() -> None:
    fam = Family("ccld_things_total", "counter", "Things done.").add(3).add(4)
    assert render([fam]) == ("# HELP ccld_things_total Things done.\n"
                             "# TYPE ccld_things_total counter\n"
                             "ccld_things_total 7\n")


def test_a_gauge_with_labels_has_one_line_per_label_set_in_the_order_added() -> None:
    fam = Family("ccld_lag_seconds", "gauge", "Lag.", ("partition", "kind"))
    fam.add(0.5, partition=1, kind="H1").add(1.25, partition=0, kind="S2").add(0.25, partition=1, kind="H1")
    assert render([fam]) == ("# HELP ccld_lag_seconds Lag.\n"
                             "# TYPE ccld_lag_seconds gauge\n"
                             'ccld_lag_seconds{partition="1",kind="H1"} 0.75\n'
                             'ccld_lag_seconds{partition="0",kind="S2"} 1.25\n')


def test_a_histogram_is_cumulative_with_an_inclusive_le_an_inf_bucket_a_sum_and_a_count() -> None:
    h = Histogram("ccld_handle_seconds", "Time per message.", (0.25, 1.0))
    for v in (0.125, 0.25, 0.5, 2.0):  # 0.25 falls in le="0.25": the bound is inclusive
        h.observe(v)
    assert render([h.family()]) == ("# HELP ccld_handle_seconds Time per message.\n"
                                    "# TYPE ccld_handle_seconds histogram\n"
                                    'ccld_handle_seconds_bucket{le="0.25"} 2\n'
                                    'ccld_handle_seconds_bucket{le="1.0"} 3\n'
                                    'ccld_handle_seconds_bucket{le="+Inf"} 4\n'
                                    "ccld_handle_seconds_sum 2.875\n"
                                    "ccld_handle_seconds_count 4\n")


def test_an_empty_histogram_still_has_every_bucket() -> None:
    text = render([Histogram("ccld_h_seconds", "H.", (1.0,)).family()])
    assert text.splitlines()[2:] == ['ccld_h_seconds_bucket{le="1.0"} 0', 'ccld_h_seconds_bucket{le="+Inf"} 0',
                                     "ccld_h_seconds_sum 0.0", "ccld_h_seconds_count 0"]


def test_label_values_escape_backslash_quote_and_newline_and_help_escapes_backslash_and_newline() -> None:
    fam = Family("ccld_odd", "gauge", 'a \\ b\nsays "hi"', ("job",)).add(1, job='x\\y"z\nw')
    assert render([fam]) == ('# HELP ccld_odd a \\\\ b\\nsays "hi"\n'
                             "# TYPE ccld_odd gauge\n"
                             'ccld_odd{job="x\\\\y\\"z\\nw"} 1\n')
    assert escape_label('\\"\n') == '\\\\\\"\\n' and escape_help('\\"\n') == '\\\\"\\n'


def test_values_are_written_as_prometheus_reads_them() -> None:
    assert [format_value(v) for v in (3, True, 0.5, 1e-05, math.inf, -math.inf, math.nan)] == [
        "3", "1", "0.5", "1e-05", "+Inf", "-Inf", "NaN"]


def test_families_render_in_order_and_a_name_twice_is_a_bug() -> None:
    a, b = Family("ccld_a", "gauge", "A.").add(1), Family("ccld_b", "gauge", "B.")
    assert render([a, b]) == "# HELP ccld_a A.\n# TYPE ccld_a gauge\nccld_a 1\n# HELP ccld_b B.\n# TYPE ccld_b gauge\n"
    assert render([]) == ""
    with pytest.raises(ValueError, match="twice"):
        render([a, Family("ccld_a", "gauge", "again")])


@pytest.mark.parametrize("name, kind, labels", [
    ("ccld-dash", "gauge", ()),  # not a metric name
    ("ccld_things", "counter", ()),  # a counter without _total
    ("ccld_x", "gauge", ("le",)),  # the histogram's own label
    ("ccld_x", "gauge", ("__reserved",)),
    ("ccld_x", "gauge", ("a", "a")),
    ("ccld_x", "gauge", ("bad-label",)),
])
def test_bad_names_and_labels_are_refused(name: str, kind: str, labels: tuple[str, ...]) -> None:
    with pytest.raises(ValueError):
        Family(name, kind, "x", labels)  # type: ignore[arg-type]


def test_a_sample_must_name_exactly_the_declared_labels() -> None:
    fam = Family("ccld_x", "gauge", "x", ("partition",))
    with pytest.raises(ValueError, match="takes labels"):
        fam.add(1)
    with pytest.raises(ValueError, match="takes labels"):
        fam.add(1, partition=0, kind="H1")


@pytest.mark.parametrize("buckets", [(), (1.0, 0.5), (0.5, 0.5), (1.0, math.inf)])
def test_histogram_buckets_must_be_finite_and_increasing(buckets: tuple[float, ...]) -> None:
    with pytest.raises(ValueError):
        Histogram("ccld_h_seconds", "H.", buckets)
