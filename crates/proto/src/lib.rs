//! cellcache-proto (being built; see ARCHITECTURE.md).
