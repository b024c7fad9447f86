//! cellcache-node (being built; see ARCHITECTURE.md).
