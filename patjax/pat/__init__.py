"""Layer 4, the paper's PAT math: Algorithm 1's Langevin sampler and where its chain settles, PR and its
perturbation laws (Theorem 2, Proposition 10). Imports `attacks`, `models`, `data` and `core`."""
