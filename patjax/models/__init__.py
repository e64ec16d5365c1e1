"""Layer 2, the networks: Flax modules on [0, 1] images, their registry and `ModelFns`, and the one
convolution and max-pool they share. Imports `data` and `core`."""
