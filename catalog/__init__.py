"""askflow's I/O layer (Kedro's data catalog, in spirit): reading and validating inputs, writing
artifacts atomically, reading params. The stages, the flows and the benchmarks import it; it
imports only ``pipelines``, so no layer imports from one above it."""
