"""The regression guard: kernels a team approved, signed and kept in a store, replayed on reserved GPUs in CI
(docs/guard.md)."""
