"""Deep-funnel evaluation: splits, baselines, metrics, report."""
