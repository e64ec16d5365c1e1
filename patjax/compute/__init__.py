"""Layer 1, the paper's math and its inputs: data, networks, margins, samplers, attacks, methods, PR
and statistics; pure functions of arrays and keys. Imports `core` only."""
