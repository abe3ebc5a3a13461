"""``simulate(scenario)``: the records a real probe fleet would emit for the scenario's job."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np

from ccld.producers.simulator.emit import emit
from ccld.producers.simulator.engine import Engine, run_engine
from ccld.producers.simulator.megatron import MegatronSim
from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.topology import Topology
from ccld.records import KernelBatch

log = logging.getLogger(__name__)


def simulate(scenario: Scenario, *, job: str | None = None) -> Iterator[tuple[float, KernelBatch]]:
    """Yield ``(t, batch)``: ``t`` is when the batch reaches the analyzer, in simulated seconds
    from the start of the run (non-decreasing); each batch holds records of one communicator.

    Only what probes observe goes out: the faults and ``expect`` stay in the scenario.
    """
    t0 = time.perf_counter()
    topo = Topology.build(scenario)
    rng = np.random.default_rng([scenario.seed, 1])
    skew = rng.uniform(-scenario.clock_skew_s, scenario.clock_skew_s, len(topo.hosts))
    d = scenario.clock_drift_ppm * 1e-6  # its own stream: scenarios without drift keep their draws
    n_hosts = len(topo.hosts)
    drift = np.random.default_rng([scenario.seed, 2]).uniform(-d, d, n_hosts) if d else np.zeros(n_hosts)
    if scenario.workload is not None:
        yield from MegatronSim(
            scenario, topo, job=job or scenario.id, producer=f"sim:{scenario.id}", skew_s=skew, drift=drift
        ).run()
        return
    phases = run_engine(scenario, topo)
    log.debug("scenario %s: %d phases modelled in %.3f s", scenario.id, len(phases), time.perf_counter() - t0)
    yield from emit(
        phases, topo, job=job or scenario.id, channels=scenario.channels, interval_s=scenario.sample_interval_s,
        duration_s=scenario.duration_s, skew_s=skew, producer=f"sim:{scenario.id}", drift=drift,
        seed=scenario.seed,
    )


def stopped_links(scenario: Scenario) -> list[tuple[str, int, int]]:
    """The links (family, src, dst) the scenario's H3 faults stop, in order (Megatron-style workload).

    A dead NIC stops the first op after its onset of each communicator through it; the job then waits
    on those, so which links stop depends on the schedule. For scenario authors, not for the analyzer.
    """
    topo = Topology.build(scenario)
    sim = MegatronSim(scenario, topo, job=scenario.id, producer="", skew_s=np.zeros(len(topo.hosts)))
    for _ in sim.run(horizon_s=max((f.onset_s for f in scenario.faults), default=0.0) + 2.0):
        pass
    return sim.stopped


def manifested(scenario: Scenario) -> list[bool]:
    """Per fault, whether it takes effect in this run (one hang can keep another from happening).

    For scenario authors (the suite generator checks its pairs of faults); not for the analyzer.
    """
    topo = Topology.build(scenario)
    if scenario.workload is not None:
        sim = MegatronSim(scenario, topo, job=scenario.id, producer="", skew_s=np.zeros(len(topo.hosts)))
        # every fault of this model fires at the first op after its onset, or never
        for _ in sim.run(horizon_s=max((f.onset_s for f in scenario.faults), default=0.0) + 2.0):
            pass
        return sim.manifested()
    engine = Engine(scenario, topo)
    engine.run()
    return engine.manifested()
