"""Analysis (issue 5): metrics, statistics and reports as pure functions over attempt records."""
