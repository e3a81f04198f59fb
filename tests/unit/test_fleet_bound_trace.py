"""The fleet targets' fluid bound takes the scenario itself, so a recorded trace (not a named
scenario) gets its bound: `specroute eval --traffic trace:PATH --fleet plan --fleet homogeneous`."""

from pathlib import Path

from evaluate.fleet_targets import fluid_bound
from evaluate.traffic import trace_traffic
from loadgen.trace_dataset import TraceOptions, TraceSelection

SLICE = Path(__file__).resolve().parents[2] / "loadgen" / "data" / "traces" / "mooncake_conversation_head400.jsonl"


def test_a_trace_gets_a_bound_over_the_given_types():
    traffic = trace_traffic(str(SLICE), TraceOptions(selection=TraceSelection(speedup=0.25)))
    scenario = traffic.scenario
    phase = scenario.phases[0].name
    bound = fluid_bound(scenario, phase, 2, 0.5, 50.0, ("k26-ar", "k26-dflash"))
    assert set(bound) == {"composition", "affinity", "fluid_optimism", "bound_ratio"}
    assert bound["composition"] >= 1.0 and bound["affinity"] >= 1.0
    assert bound["bound_ratio"] > 0
