"""One frozen settings object per process, built from defaults, ``CCLD_*`` variables and flags.

Every field of ``Settings`` is read from ``CCLD_<FIELD>`` and every field of the nested
``AnalyzerSettings`` from ``CCLD_ANALYZER_<FIELD>``. Unknown ``CCLD_*`` variables and unknown
keys are rejected with a clear message, so a typo never silently leaves a default in force.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ccld.errors import ConfigError

ENV_PREFIX = "CCLD_"
ANALYZER_PREFIX = "ANALYZER_"
#: CCLD_* variables that are not settings: the test suite's broker; the launch's job name ``ccld run`` hands its
#: ranks; the attachment's cost counters and its switch for Flight Recorder's GIL-free dump; ``ccld up``'s
#: lifeline to its children; the NCCL profiler plugin's own (read by the C library, set by ``ccld run
#: --nccl-plugin``). A rank loads its settings from an environment that holds them.
NOT_SETTINGS = frozenset({
    "CCLD_TEST_BOOTSTRAP", "CCLD_JOB_LAUNCH", "CCLD_ATTACH_COST", "CCLD_SUPERVISOR",
    "CCLD_NCCL_DIR", "CCLD_NCCL_SLOTS", "CCLD_NCCL_QUIET", "CCLD_NCCL_PLUGIN", "CCLD_FR_NATIVE",
})  # fmt: skip


@dataclass(frozen=True)
class AnalyzerSettings:
    """Decision thresholds; times are seconds on the analyzer's clock or a rank's own clock.

    Defaults are tuned on ``benchmarks/scenarios/standard.jsonl`` (1 s probe samples in the
    simulator; the real probe samples every 100 ms, which only makes every decision faster).
    """

    # --- slow ratio P = excess spread / excess time; P <= alpha: S2, P >= beta: S1, else S3
    alpha: float = 0.4  # P <= alpha: S2 (comm-slow)
    beta: float = 0.6  # P >= beta: S1 (comp-slow); in between: S3

    # --- hangs
    hang_min_s: float = 20.0  # never declare a not-entered hang (H1) shorter than this
    h2_min_s: float = 8.0  # signatures differ at one op sequence and nothing moved for this long
    h3_min_s: float = 15.0  # everyone entered a consistent op and counters stayed frozen this long
    barrier_hang_min_s: float = 45.0  # H1 at a barrier (checkpoints wait there) needs this long
    hang_op_factor: float = 8.0  # a hang also needs stall >= this x the longest healthy op time learned
    hang_max_s: float = 900.0  # learned tolerances never push a hang threshold beyond this
    pause_tolerance: float = 1.5  # a stall recurring like a benign pause seen before waits this x longer
    pause_memory: int = 8  # benign pauses remembered per communicator
    cadence_ops: int = 64  # recent ops per communicator learned as a signature pattern (H2 without majority)
    wait_edge_min_s: float = 2.0  # a communicator counts as waiting (wait-for edge) after this stall
    # silent this long (longer than a delivery interval, shorter than any hang threshold), a stall no rank was
    # seen waiting in longer than its ops have lasted is a cut: the job ended, or its link to the broker did
    cut_min_s: float = 3.0
    cut_wait_min_s: float = 1.0  # ... nor for this long (own clock)

    # --- slowness
    slow_factor: float = 1.3  # an op is slow when its time exceeds slow_factor x the learned baseline
    slow_min_excess_s: float = 1e-5  # ... and exceeds the baseline by at least this much (s; ops last 50 us and up)
    slow_mad_k: float = 6.0  # ... and by this many median absolute deviations of the baseline
    slow_min_ops: int = 3  # "repeated counting": slow ops (of the window) before a slow verdict
    slow_window_ops: int = 5  # window of recent ops per signature the repeated counting looks at
    slow_resolve_ops: int = 6  # consecutive normal ops that resolve a slow incident
    slow_confirm_s: float = 3.0  # a window stays alarmed this long (job time) before a slow verdict
    # an S1's or S3's late arriver must lead its alarmed window this long itself: a rank's own GC or
    # data-loader pauses come in bursts of a few seconds (fa-1-0003 in benchmarks/false_alarms.py)
    culprit_confirm_s: float = 8.0
    # a slow communication whose members' hosts stalled for CPUs this share of the wall time (Linux PSI "some":
    # some task waited for a CPU, KernelBatch.cpu_wait) is a loaded host, not a slow link: no S2 (0: never)
    starved_wait_share: float = 0.5
    # ... and one whose hosts were stalled at least contended_wait_share (a transport timed on contended CPUs)
    # is reported only when its extra time per call is at least slow_min_cost_share of the time between the
    # communicator's calls: what it costs the job (SlowDetector.cost; 0: always reported)
    contended_wait_share: float = 0.05
    # (5 %: CI's healthy gloo job, its host stalled 15 % of the time, had a loopback send of 5-8 ms against
    # 0.25 ms in 4 of 5 steps, 2.5 % of its time: a time slice or two of a contended scheduler per call);
    # so is a late arriver whose lateness is that small a share (a loopback sender 232 us late a 100-ms step)
    slow_min_cost_share: float = 0.05
    # ... and on any host that measured its CPU stalls, one under slow_min_cost_share whose extra time per call is
    # below this (s): shorter than a scheduler's time slice, a CPU-timed transfer's delay is no link's to tell
    host_timed_min_extra_s: float = 5e-4
    # an S2 whose link no counter names is reported after this long alarmed, slow in every op of that time
    slow_link_wait_s: float = 10.0
    baseline_min_ops: int = 6  # healthy ops per signature learned before slowness is judged
    baseline_warmup_s: float = 10.0  # ... and a communicator's first seconds (pipeline fill) are never judged
    baseline_ops: int = 32  # recent healthy ops per signature whose medians are its baseline (follows the phase)
    culprit_share: float = 0.6  # the late arriver / backlog rank must be the same in this share of slow ops
    # ... of an all_to_all's window of ops (slow or not): healthy experts take turns being last (what the
    # router sent each), a straggling one is last every time; in a group of two, 2 of 3 is a coin's luck
    all_to_all_culprit_share: float = 0.8
    # ... of a collective of two members' slow ops: where both pause now and then (GC, a data loader), each
    # leads about half the slow ops, and 2 of 3 is a coin's luck (a healthy 2-rank DP job whose pauses of 667 ms
    # came close together: S1 on the one that led 2 of 3 reduce-scatters); a slow member leads nearly all
    pair_culprit_share: float = 0.8
    culprit_gap_share: float = 0.5  # late arriver computed >= this share of its lateness longer than peers, else victim
    culprit_gap_ratio: float = 0.15  # ... and >= this fraction of its peers' own compute gap (else it is jitter)
    # a rank slow from the job's first step has no healthy history to be judged against; its peers are:
    # a collective's last arriver computing this much longer than its peers' mean is slow: 0.4, so a replica 1.5x
    # slower in compute from its first step (its gap before the op 50 ms against 33, jittered around 0.5) is
    # clearly so in most ops, not in half of them (heldout-any-7's any-pp-S1-32-094: no verdict at 0.5)
    peer_gap_ratio: float = 0.4
    peer_link_factor: float = 1.5  # a communicator's own kernel time this x its sibling communicators' is a slow link
    peer_min_excess_s: float = 1e-3  # ... by at least this much (s): below it, no verdict without a learned baseline
    # a collective's late arriver that computed longer, and holds this share of the time its peers wait in it
    blame_share: float = 0.5
    blame_min_share: float = 0.1  # ... costing them this share of the time between its calls, is slow against them
    blame_ops: int = 16  # ... averaged over this many of its ops (0: off)
    # a ring whose links are all of one kind (one host's, or one rank per host) whose in-flight samples found the
    # send backlog before the same member this many sampled ops in a row (and culprit_share of all its backlog
    # there) is slow on that member's link against its other links, with no history (0: off, for hardware
    # where one link of such a ring is always the slowest by design)
    slow_link_pinned_ops: int = 8
    # a DONE record's per-kernel peak backlog (probe v2) counts as a slow link's backlog only where it
    # stands out from the communicator's learned healthy peak level (a rank normally receives a step
    # or two ahead of forwarding it): peak > level + max(peak_margin, peak_margin_ratio x level)
    peak_margin: float = 3.0  # counter units a channel's peak must exceed the learned healthy level by
    peak_margin_ratio: float = 1.0  # ... and this multiple of the level (a job whose healthy peaks run higher)
    peak_learn_rows: int = 64  # DONE peaks of a communicator learned before any of them counts
    peak_learn_rate: float = 0.02  # weight of each healthy row in the learned level (exponential average)

    # --- bookkeeping
    finalize_timeout_s: float = 10.0  # an op missing some DONE records is closed after this long
    resolved_memory: int = 2048  # resolved incidents remembered for dedupe (state_dict stays bounded)
    batch_memory: int = 4096  # (producer, batch_seq) pairs remembered per producer for duplicate batches
    producer_memory: int = 256  # producers whose batch sequence numbers are remembered
    incident_reopen_s: float = 60.0  # an incident resolves after this long quiet; its fault back sooner is an episode
    incident_close_silent_s: float = 60.0  # a job silent this long has ended: its open incidents are closed
    job_expiry_s: float = 3600.0  # a job incarnation silent this long (and without open incidents) is dropped
    update_min_interval_s: float = 10.0  # at most one UPDATE per incident in this interval (class changes: at once)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) < 0:
                raise ConfigError(f"analyzer setting {f.name} must not be negative, got {getattr(self, f.name)}")
        if not 0.0 <= self.alpha <= self.beta <= 1.0:
            raise ConfigError(f"analyzer thresholds need 0 <= alpha <= beta <= 1, got {self.alpha}, {self.beta}")
        if not 1 <= self.slow_min_ops <= self.slow_window_ops:
            raise ConfigError(
                f"analyzer needs 1 <= slow_min_ops <= slow_window_ops, got {self.slow_min_ops}, {self.slow_window_ops}"
            )


@dataclass(frozen=True)
class Settings:
    """Everything a CCL-D process can be told. Units are in the names."""

    bootstrap: str = ""  # Kafka bootstrap servers; empty: start the embedded broker
    topic_prefix: str = "ccl-d."  # topics are <prefix>metrics, <prefix>verdicts, <prefix>deadletter
    metrics_partitions: int = 4  # partitions of the metrics topic (the most workers that share the load)
    analysis_groups: int = 1  # spread each job's communicators over this many metrics partitions (1: one per job)
    verdicts_partitions: int = 1  # partitions of the verdicts topic
    deadletter_partitions: int = 1  # partitions of the dead-letter topic
    replication_factor: int = 1  # replication of topics CCL-D creates
    # how long each topic keeps its messages (Kafka's retention.ms; -1: for ever) and how many bytes per
    # partition (retention.bytes; -1: no limit): `ccld topics` sets them on the topics it creates, and on
    # existing ones where they differ. The worker's state log is compacted, its tombstones kept this long.
    metrics_retention_ms: int = 6 * 3_600_000  # the sink archives them: the topic covers a sink's outage
    metrics_retention_bytes: int = -1
    reports_retention_ms: int = 6 * 3_600_000  # shard reports: read within seconds by the job stage
    deadletter_retention_ms: int = 7 * 86_400_000
    verdicts_retention_ms: int = 28 * 86_400_000  # `ccld verdicts`, the alert bridge and the sink read them
    state_delete_retention_ms: int = 86_400_000
    job: str = "default"  # job id producers stamp on their records
    archive_dir: str = "ccld-archive"  # root folder of the Parquet archive
    # `ccld archive prune` removes the days older than this (UTC; 0: it needs --older-than, nothing is pruned)
    archive_retention_days: float = 0.0
    sink_group: str = "ccld-sink"  # consumer group of the Parquet sink
    sink_max_rows: int = 100_000  # rows per Parquet file (and row group) at most
    sink_max_age_s: float = 10.0  # flush a partial file after this long
    # the sink compacts its archive this often (and prunes past archive_retention_days when set; 0: never)
    sink_compact_every_s: float = 600.0
    sink_compact_max_file_mb: float = 64.0  # files this large are left as they are (a day: a few large files)
    # the cluster's view (`ccld nodes`, the alert bridge's CcldHostSuspect): a host is a drain candidate when it
    # was root cause in at least fleet_min_incidents incidents of fleet_min_jobs jobs within fleet_window_days
    fleet_window_days: float = 1.0  # benchmarks/fleet.py chose the three: a week of 64 hosts, RESULTS.md
    fleet_min_incidents: int = 4
    fleet_min_jobs: int = 2
    fleet_half_life_h: float = 24.0  # each incident's share of a host's score halves this often
    sink_metrics_port: int = 9464  # `ccld sink` serves Prometheus metrics at http://<metrics_bind>:PORT/metrics; 0: off
    worker_app_id: str = "ccld-worker"  # Faust app id (consumer group and changelog names)
    worker_web_port: int = 0  # 0: no web server
    status_workers: str = ""  # `ccld status`: the workers' web addresses, comma-separated (empty: this machine's)
    worker_tick_s: float = 1.0  # how often the worker re-evaluates open operations
    worker_commit_interval_s: float = 2.8  # how often the worker commits consumed offsets
    # how long the broker may hold the worker's fetch when none of its partitions has anything new: a fetch of
    # the quiet partitions keeps a busy one from being fetched until it returns (streams/transport.py)
    worker_fetch_wait_ms: int = 100
    worker_shutdown_grace_s: float = 30.0  # after SIGTERM/SIGINT the worker exits anyway after this long
    worker_clock_max_skew_s: float = 30.0  # timestamps this far ahead of the producers' consensus do not move the clock
    worker_clock_active_s: float = 120.0  # a producer silent this long no longer votes on the analyzer clock
    worker_caught_up_lag_s: float = 5.0  # reading messages later than this, the worker is behind: silence is no hang
    worker_deadletter_raw_max_bytes: int = 65_536  # raw bytes of a bad message kept in its dead letter
    # a partition's state snapshot larger than this is not written (one message: Kafka refuses more than
    # message.max.bytes, 1 MiB by default, and Faust's producer 1,000,000 bytes a request): an error, a counter,
    # its offsets left uncommitted; verdicts go out
    worker_snapshot_max_bytes: int = 950_000
    # `ccld up`: the embedded broker (which never compacts or expires a log) is restarted empty once its memory
    # passes this many MB, at a moment when nothing has arrived for up_renew_quiet_s and nothing is open,
    # pending, unread or unarchived (stack/renew.py); 0: never
    up_broker_renew_mb: float = 2048.0
    up_renew_quiet_s: float = 120.0
    producer_queue_max: int = 200_000  # kernel records waiting in a producer, at most
    producer_batch_max: int = 2_000  # kernel records per batch message, at most
    producer_linger_ms: int = 500  # a batch waits at most this long for more records (fewer, larger messages)
    producer_message_timeout_ms: int = 30_000  # a message the broker has not taken by then is expired (lost or spooled)
    producer_connect_timeout_s: float = 15.0  # ccld simulate fails when no broker answers within this long
    spool_dir: str = ""  # folder of the on-disk spool for records the broker did not take; empty: no spool
    spool_max_mb: float = 256.0  # the spool holds at most this much; records beyond it are counted lost
    spool_max_age_s: float = 3600.0  # spooled records older than this are discarded (counted lost), not replayed
    verdicts_broker_timeout_s: float = 30.0  # `ccld verdicts` exits (code 2) when no broker answered for this long
    alert_group: str = "ccld-alert"  # consumer group of `ccld alert`
    alert_alertmanager_url: str = ""  # Alertmanager base URL for `ccld alert` (http://host:9093); empty: none
    alert_webhook_url: str = ""  # URL `ccld alert` POSTs each verdict to as JSON; empty: none
    alert_slack: bool = False  # the webhook gets a Slack-compatible {"text": ...} body instead of the verdict
    # how the worker writes verdicts: "avro" (single-object encoding, docs/wire-format.md) or "json" (the fields
    # of `ccld verdicts --json`, header content-type: application/json), for consumers without our schemas;
    # every reader of the topic takes both
    verdicts_encoding: str = "avro"
    alert_repeat_s: float = 60.0  # re-post open incidents to Alertmanager this often (it resolves alerts not re-sent)
    alert_backlog_max: int = 1_000  # verdicts waiting for a receiver, at most; then consuming pauses (none dropped)
    alert_timeout_s: float = 10.0  # one HTTP delivery attempt gives up after this long
    alert_retry_max_s: float = 30.0  # retries of a failed delivery back off from 0.5 s, doubling up to this
    alert_metrics_port: int = 9465  # `ccld alert` serves Prometheus metrics on this port; 0: off
    aggregator_metrics_port: int = 9466  # the host aggregator of `ccld run` serves Prometheus metrics here; 0: off
    metrics_bind: str = "127.0.0.1"  # address every metrics endpoint (and the worker's web server) listens on
    session_timeout_ms: int = 6_000  # consumer group session timeout (short: fast joins and failover)
    heartbeat_ms: int = 2_000  # consumer group heartbeat interval
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, for every Kafka client
    sasl_mechanism: str = ""  # PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with a SASL_* protocol)
    sasl_username: str = ""  # SASL user name
    sasl_password: str = field(default="", repr=False)  # SASL password (never logged)
    ssl_ca_location: str = ""  # PEM file of the CA that signed the broker's certificate; empty: system CAs
    ssl_certificate_location: str = ""  # PEM client certificate (mutual TLS)
    ssl_key_location: str = ""  # PEM private key of the client certificate
    kafka_config_file: str = ""  # librdkafka properties file (key=value lines) merged into every client's config
    log_level: str = "INFO"  # DEBUG, INFO, WARNING, ERROR
    analyzer: AnalyzerSettings = field(default_factory=AnalyzerSettings)

    def topic(self, kind: str) -> str:
        """Full topic name of ``metrics``, ``verdicts``, ``deadletter`` or ``reports``."""
        return f"{self.topic_prefix}{kind}"

    @property
    def metrics_topic(self) -> str:
        return self.topic("metrics")

    @property
    def verdicts_topic(self) -> str:
        return self.topic("verdicts")

    @property
    def deadletter_topic(self) -> str:
        return self.topic("deadletter")

    @property
    def reports_topic(self) -> str:
        """Shard reports, for the job stage (used when ``analysis_groups`` > 1)."""
        return self.topic("reports")

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (``analyzer_<name>`` keys change analyzer fields)."""
        return _build(self, changes, source="argument")

    def to_env(self) -> dict[str, str]:
        """``CCLD_*`` variables that rebuild these settings in a child process (non-default fields)."""
        out: dict[str, str] = {}
        default = Settings()
        for f in dataclasses.fields(Settings):
            if f.name != "analyzer" and getattr(self, f.name) != getattr(default, f.name):
                out[f"{ENV_PREFIX}{f.name.upper()}"] = str(getattr(self, f.name))
        for f in dataclasses.fields(AnalyzerSettings):
            if getattr(self.analyzer, f.name) != getattr(default.analyzer, f.name):
                out[f"{ENV_PREFIX}{ANALYZER_PREFIX}{f.name.upper()}"] = str(getattr(self.analyzer, f.name))
        return out

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``CCLD_*`` variables of ``env`` (default: the process environment), then overrides.

        Overrides whose value is None are ignored, so CLI flags that were not given leave
        the environment's value in force.
        """
        env = os.environ if env is None else env
        from_env: dict[str, Any] = {}
        for key, value in env.items():
            if not key.startswith(ENV_PREFIX) or key in NOT_SETTINGS:
                continue
            from_env[key[len(ENV_PREFIX) :].lower()] = value
        base = _build(cls(), from_env, source="environment variable")
        return _build(base, {k: v for k, v in overrides.items() if v is not None}, source="argument")


def known_env_vars() -> set[str]:
    """Every ``CCLD_*`` variable the settings object reads."""
    names = {f"{ENV_PREFIX}{f.name.upper()}" for f in dataclasses.fields(Settings) if f.name != "analyzer"}
    names |= {f"{ENV_PREFIX}{ANALYZER_PREFIX}{f.name.upper()}" for f in dataclasses.fields(AnalyzerSettings)}
    return names


def _build(base: Settings, changes: Mapping[str, Any], *, source: str) -> Settings:
    top = {f.name: f for f in dataclasses.fields(Settings) if f.name != "analyzer"}
    ana = {f.name: f for f in dataclasses.fields(AnalyzerSettings)}
    top_changes: dict[str, Any] = {}
    ana_changes: dict[str, Any] = {}
    for key, value in changes.items():
        if key in top:
            top_changes[key] = _coerce(key, top[key], value, source)
        elif key.startswith(ANALYZER_PREFIX.lower()) and key[len(ANALYZER_PREFIX) :] in ana:
            name = key[len(ANALYZER_PREFIX) :]
            ana_changes[name] = _coerce(key, ana[name], value, source)
        elif key == "analyzer" and isinstance(value, AnalyzerSettings):
            top_changes["analyzer"] = value
        else:
            env = source.startswith("environment")
            shown = f"{ENV_PREFIX}{key.upper()}" if env else key
            names = sorted(known_env_vars()) if env else sorted([*top, *(f"analyzer_{n}" for n in ana)])
            close = difflib.get_close_matches(shown, names, n=3)
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ConfigError(f"unknown {source} {shown!r}{hint}; every setting is listed in "
                              "docs/configuration.md")
    analyzer = top_changes.pop("analyzer", base.analyzer)
    if ana_changes:
        analyzer = dataclasses.replace(analyzer, **ana_changes)
    out = dataclasses.replace(base, analyzer=analyzer, **top_changes)
    _validate(out)
    return out


_HINTS: dict[type, dict[str, Any]] = {}


def _coerce(key: str, f: dataclasses.Field[Any], value: Any, source: str) -> Any:
    owner = Settings if f.name in {x.name for x in dataclasses.fields(Settings)} else AnalyzerSettings
    hints = _HINTS.setdefault(owner, typing.get_type_hints(owner))
    kind = hints[f.name]
    if isinstance(kind, types.UnionType):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    try:
        if kind is bool and isinstance(value, str):
            low = value.strip().lower()
            if low not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise ValueError(value)
            return low in {"1", "true", "yes", "on"}
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source} {key!r}: {value!r} is not a valid {kind.__name__}") from exc


def _validate(s: Settings) -> None:
    for name in ("metrics_partitions", "verdicts_partitions", "deadletter_partitions", "replication_factor",
                 "analysis_groups"):
        if getattr(s, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(s, name)}")
    for name in ("metrics_retention_ms", "metrics_retention_bytes", "reports_retention_ms", "deadletter_retention_ms",
                 "verdicts_retention_ms", "state_delete_retention_ms"):
        if getattr(s, name) == 0 or getattr(s, name) < -1:
            raise ConfigError(f"{name} must be positive, or -1 for no limit, got {getattr(s, name)}")
    if s.up_broker_renew_mb < 0 or s.up_renew_quiet_s < 0:
        raise ConfigError(f"up_broker_renew_mb and up_renew_quiet_s must be 0 or more, got {s.up_broker_renew_mb} "
                          f"and {s.up_renew_quiet_s}")
    if not 1 <= s.worker_fetch_wait_ms <= 60_000:
        raise ConfigError(f"worker_fetch_wait_ms must be from 1 to 60000, got {s.worker_fetch_wait_ms}")
    if s.worker_snapshot_max_bytes < 1:
        raise ConfigError(f"worker_snapshot_max_bytes must be at least 1, got {s.worker_snapshot_max_bytes}")
    if s.analysis_groups > s.metrics_partitions:
        # two groups of a job on one partition would be analyzed as one shard: allowed by the design, but
        # the point of groups is one partition each
        raise ConfigError(f"analysis_groups ({s.analysis_groups}) must not exceed metrics_partitions "
                          f"({s.metrics_partitions})")
    if s.producer_batch_max < 1 or s.producer_queue_max < s.producer_batch_max:
        raise ConfigError("producer_queue_max must be at least producer_batch_max, which must be >= 1")
    if s.producer_message_timeout_ms < 1 or s.producer_connect_timeout_s <= 0:
        raise ConfigError("producer_message_timeout_ms and producer_connect_timeout_s must be positive")
    if s.spool_max_mb <= 0 or s.spool_max_age_s <= 0:
        raise ConfigError("spool_max_mb and spool_max_age_s must be positive")
    for name in ("verdicts_broker_timeout_s", "alert_repeat_s", "alert_timeout_s", "alert_retry_max_s"):
        if getattr(s, name) <= 0:
            raise ConfigError(f"{name} must be positive, got {getattr(s, name)}")
    for name in ("worker_web_port", "sink_metrics_port", "alert_metrics_port", "aggregator_metrics_port"):
        if not 0 <= getattr(s, name) <= 65535:
            raise ConfigError(f"{name} must be a port from 0 (off) to 65535, got {getattr(s, name)}")
    if s.fleet_window_days <= 0 or s.fleet_half_life_h <= 0 or s.fleet_min_incidents < 1 or s.fleet_min_jobs < 1:
        raise ConfigError("fleet_window_days and fleet_half_life_h must be positive, fleet_min_incidents and "
                          "fleet_min_jobs at least 1")
    if s.verdicts_encoding not in ("avro", "json"):
        raise ConfigError(f"verdicts_encoding must be avro or json, got {s.verdicts_encoding!r}")
    if s.sink_compact_max_file_mb <= 0:
        raise ConfigError(f"sink_compact_max_file_mb must be positive, got {s.sink_compact_max_file_mb}")
    if s.alert_backlog_max < 1:
        raise ConfigError(f"alert_backlog_max must be at least 1, got {s.alert_backlog_max}")
    for name in ("alert_alertmanager_url", "alert_webhook_url"):
        url = getattr(s, name)
        # a typo (no scheme, a host without http://) must fail at startup, not as retries forever
        if url and not url.lower().startswith(("http://", "https://")):
            raise ConfigError(f"{name} must be an http:// or https:// URL, got {url!r}")
    _validate_security(s)
    a = s.analyzer
    if not 0.0 <= a.alpha <= a.beta <= 1.0:
        raise ConfigError(f"analyzer thresholds need 0 <= alpha <= beta <= 1, got {a.alpha}, {a.beta}")


SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _validate_security(s: Settings) -> None:
    # Checked here, not by the clients: a typo must fail at startup, not as a silent PLAINTEXT connection.
    if s.security_protocol.upper() not in SECURITY_PROTOCOLS:
        raise ConfigError(f"security_protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, "
                          f"got {s.security_protocol!r}")
    if s.kafka_config_file:
        return  # the file may supply the rest; ccld.security checks the merged config when clients are built
    sasl = s.security_protocol.upper().startswith("SASL_")
    if sasl and s.sasl_mechanism.upper() not in SASL_MECHANISMS:
        raise ConfigError(f"security_protocol {s.security_protocol} needs sasl_mechanism, one of "
                          f"{', '.join(SASL_MECHANISMS)} (got {s.sasl_mechanism!r})")
    if sasl and not s.sasl_username:
        raise ConfigError(f"security_protocol {s.security_protocol} needs sasl_username (and sasl_password)")
    if not sasl and (s.sasl_mechanism or s.sasl_username or s.sasl_password):
        raise ConfigError(f"SASL settings are given but security_protocol is {s.security_protocol}; "
                          "use SASL_SSL (or SASL_PLAINTEXT on a trusted network)")
    if bool(s.ssl_certificate_location) != bool(s.ssl_key_location):
        raise ConfigError("ssl_certificate_location and ssl_key_location go together (mutual TLS)")
