"""Policy evaluation on the twin's engine with a virtual clock (`specroute eval`).

Entry point: `evaluate.cli.main(argv)`.
"""

from evaluate.runner import ScenarioResult, run_scenario
from evaluate.scenarios import SCENARIOS, Phase, Scenario

__all__ = ["SCENARIOS", "Phase", "Scenario", "ScenarioResult", "run_scenario"]
