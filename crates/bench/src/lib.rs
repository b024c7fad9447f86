//! cellcache-bench (being built; see ARCHITECTURE.md).
