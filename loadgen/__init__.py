"""loadgen: the specroute load generator (HTTP only; imports nothing from gateway/, backends/ or
policies/; the stream clock and percentiles come from the neutral common/).

Public API:
- `print_table(summary)`: side-by-side table of a summary.json (path, dict or Summary).
- `compare(a, b)`: ratios B / A of two summaries.
- `load_summary(path)`, `Summary`, `Run`, `Level`, `RequestRecord`: the result schema.
- `main(argv)`: the command line, callable in-process.
"""

from loadgen.cli import main
from loadgen.report import compare, print_table
from loadgen.summary import Level, RequestRecord, Run, Summary, load_summary

__all__ = ["Level", "RequestRecord", "Run", "Summary", "compare", "load_summary", "main", "print_table"]
