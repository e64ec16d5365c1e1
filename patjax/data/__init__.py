"""Layer 1, the inputs: the CIFAR splits as arrays, their augmentation, and the archive's download
into a checked cache. Imports `core`."""
