//! cellcache-testkit: test-only tools (being built; see ARCHITECTURE.md).
