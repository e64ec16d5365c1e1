"""Layer 0, glue: errors, atomic files and strict JSON, file locks, provenance, devices and sharding,
the command lines' shared flags. Imports nothing of patjax outside `core`."""
