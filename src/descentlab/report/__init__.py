"""Reports: Markdown/CSV tables and matplotlib figures built from results.json."""

from descentlab.report.build import write_combined_report, write_report

__all__ = ["write_combined_report", "write_report"]
