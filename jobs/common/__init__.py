"""What every job shares: the SparkSession factory, the Delta reader/writer, flag parsing and stage logging."""
