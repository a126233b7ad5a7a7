"""FAISS retrieval indexes: choosing the index (choose), building and tuning it (build), publishing a version
atomically (publish) and reading the live one (reader). Only `build` and `reader` import faiss; nothing here
imports Spark, so a serving process can use `jobs.index.reader` with faiss, numpy and pyarrow alone."""
