"""The training job's Spark-side inputs (jobs.train_encoder runs them)."""
