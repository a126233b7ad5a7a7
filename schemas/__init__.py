"""Table contracts (schemas.tables, needs pyspark) and the integer codes shared with the model (schemas.codes,
pure Python so that hir_model can import it without Spark)."""
