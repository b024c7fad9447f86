//! How the store's CAS values and failures read in the protocol, shared by the classic
//! commands (`local`) and the meta commands (`meta`): CAS in and out under memcached's `-C`,
//! and the reply a store failure gets.

use cellcache_proto::lines;
use cellcache_store::{StoreError, WriteMode, WriteOutcome};

use crate::cell::Cell;
use crate::counters::LocalCounters;

/// A CAS that no item has: the store hands out CAS values from 1 upwards, and under `-C`
/// clients cannot choose one (`E` is refused or ignored).
const CAS_NEVER_MATCHES: u64 = u64::MAX;

/// memcached `-C` (`store.cas_enabled = false`) keeps no CAS: every CAS a client sees is 0.
pub(crate) fn cas_out(cell: &Cell, cas: u64) -> u64 {
    if cell.store.config().cas_enabled {
        cas
    } else {
        0
    }
}

/// The compare of a storage command (`cas`, `ms C`). Under `-C` memcached's storage path
/// never matches: `EXISTS`/`EX` when the item exists, `NOT_FOUND`/`NF` otherwise.
pub(crate) fn store_compare(cell: &Cell, compare: Option<u64>) -> Option<u64> {
    if cell.store.config().cas_enabled {
        compare
    } else {
        compare.map(|_| CAS_NEVER_MATCHES)
    }
}

/// The compare of `md C` / `ma C`. Under `-C` memcached compares with the item's CAS of 0:
/// `C0` matches any item, any other value none.
pub(crate) fn zero_compare(cell: &Cell, compare: Option<u64>) -> Option<u64> {
    if cell.store.config().cas_enabled {
        compare
    } else {
        compare.and_then(|c| (c != 0).then_some(CAS_NEVER_MATCHES))
    }
}

/// A client-chosen CAS (`E`); dropped under `-C`, where items carry none.
pub(crate) fn new_cas(cell: &Cell, explicit: Option<u64>) -> Option<u64> {
    explicit.filter(|_| cell.store.config().cas_enabled)
}

/// memcached answers an append/prepend whose result would be too large `NOT_STORED` (its
/// allocation of the combined item fails inside the store step), not `SERVER_ERROR`; the
/// existing item stays.
pub(crate) fn appended_too_large_is_not_stored(
    result: Result<WriteOutcome, StoreError>,
    mode: WriteMode,
) -> Result<WriteOutcome, StoreError> {
    match (result, mode) {
        (Err(StoreError::TooLarge { .. }), WriteMode::Append | WriteMode::Prepend) => {
            Ok(WriteOutcome::NotStored)
        }
        (result, _) => result,
    }
}

/// The `SERVER_ERROR` line memcached sends for a store failure.
pub(crate) fn store_error_line(e: StoreError, counters: &mut LocalCounters) -> &'static [u8] {
    match e {
        StoreError::TooLarge { .. } => {
            counters.store_too_large += 1;
            lines::SERVER_ERROR_OBJECT_TOO_LARGE
        }
        StoreError::OutOfMemory => {
            counters.store_no_memory += 1;
            lines::SERVER_ERROR_OUT_OF_MEMORY
        }
        StoreError::KeyLength(_) => lines::CLIENT_ERROR_BAD_COMMAND_LINE_FORMAT,
        StoreError::NonNumeric => lines::CLIENT_ERROR_NON_NUMERIC,
    }
}
