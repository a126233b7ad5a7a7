"""The training job's parts (jobs.train_encoder wires them): its Spark-side inputs (inputs, next_period), the run's
folder, resume, stopping and report (run), the day's codebooks (codebooks) and day-to-day continuity (continuity)."""
