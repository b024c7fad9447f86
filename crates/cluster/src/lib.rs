//! cellcache-cluster (being built; see ARCHITECTURE.md).
