//! Command counters for `stats` (memcached's names), kept per connection and folded into
//! the cell-wide atomics once per batch of input, so the request path never contends on a
//! shared cache line per command.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($name:ident),* $(,)?) => {
        /// One connection's counts since its last flush.
        #[derive(Debug, Default, Clone, Copy)]
        pub struct LocalCounters { $(pub $name: u64,)* }

        /// Cell-wide totals.
        #[derive(Debug, Default)]
        pub struct Counters { $(pub $name: AtomicU64,)* }

        /// A copy of [`Counters`] at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct CountersSnapshot { $(pub $name: u64,)* }

        impl Counters {
            /// Adds `local` to the totals and zeroes it.
            pub fn absorb(&self, local: &mut LocalCounters) {
                $(if local.$name != 0 { self.$name.fetch_add(local.$name, Relaxed); })*
                *local = LocalCounters::default();
            }

            pub fn snapshot(&self) -> CountersSnapshot {
                CountersSnapshot { $($name: self.$name.load(Relaxed),)* }
            }

            /// `stats reset`.
            pub fn reset(&self) {
                $(self.$name.store(0, Relaxed);)*
            }
        }
    };
}

counters!(
    cmd_get,
    cmd_set,
    cmd_flush,
    cmd_touch,
    cmd_meta,
    get_hits,
    get_misses,
    delete_misses,
    delete_hits,
    incr_misses,
    incr_hits,
    decr_misses,
    decr_hits,
    cas_misses,
    cas_hits,
    cas_badval,
    touch_hits,
    touch_misses,
    store_too_large,
    store_no_memory,
    auth_cmds,
    auth_errors,
    auth_throttled,
    protocol_errors,
    conn_yields,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absorb_adds_and_clears() {
        let c = Counters::default();
        let mut l = LocalCounters {
            cmd_get: 3,
            get_hits: 2,
            ..Default::default()
        };
        c.absorb(&mut l);
        c.absorb(&mut l);
        let s = c.snapshot();
        assert_eq!((s.cmd_get, s.get_hits, s.cmd_set), (3, 2, 0));
        assert_eq!(l.cmd_get, 0);
    }
}
