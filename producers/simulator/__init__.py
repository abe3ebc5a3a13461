"""Fault-injecting discrete-event simulator of a training job (emits what real probes would)."""

from ccld.producers.simulator.publish import publish
from ccld.producers.simulator.scenario import Scenario, iter_scenarios, load_scenarios
from ccld.producers.simulator.sim import simulate

__all__ = ["Scenario", "iter_scenarios", "load_scenarios", "publish", "simulate"]
