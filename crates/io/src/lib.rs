//! cellcache-io (being built; see ARCHITECTURE.md).
