"""Layer 4, the paper's PAT math: Algorithm 1's sampler and where its chain settles, PR and its laws (Theorem 2,
Proposition 10), P(violation) by AMLS, smoothing's class counts. Imports `attacks`, `models`, `data` and `core`."""
