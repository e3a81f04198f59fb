"""Policy evaluation on the twin's engine with a virtual clock (`specroute eval`).

Entry point: `policies.eval.cli.main(argv)`.
"""

from policies.eval.runner import ScenarioResult, run_scenario
from policies.eval.scenarios import SCENARIOS, Phase, Scenario

__all__ = ["SCENARIOS", "Phase", "Scenario", "ScenarioResult", "run_scenario"]
