"""The ground floor: errors, units, typed configs, table features, shard geometry, constraints, the shared
host-side types and the file formats. Imports nothing else of the project."""
