//! cellcache-store (being built; see ARCHITECTURE.md).
