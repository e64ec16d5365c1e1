"""Layer 0, glue: errors, atomic files and strict JSON, file locks, provenance, devices and sharding,
path flags checked for their kind, the command lines' shared flags. Imports nothing of patjax outside `core`."""
