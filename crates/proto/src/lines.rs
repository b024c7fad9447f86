//! Every reply line a server sends verbatim, `\r\n` included, defined once.
//!
//! The server copies these into its output buffer, [`crate::Response::encode`] writes the
//! fixed ones, and tests compare against them, so a reply's wording lives in one place.
//! Lines that carry data (`VALUE`, `STAT`, `VERSION`, numbers, meta replies with flags) are
//! composed with [`crate::Response`] and the `write_*` functions instead.
//!
//! Wording is memcached 1.6.18's wherever memcached has the case (checked against it; see
//! the wire tables in crates/cli/tests/protocol/); the few that are cellcache's own are
//! marked so and documented in docs/protocol.md.

use crate::error::{ClientError, ServerError};

/// Declares one `&[u8]` constant per line: the literal is written once, the `\r\n` added.
macro_rules! lines {
    ($($(#[$doc:meta])* $name:ident = $text:literal;)*) => {
        $($(#[$doc])* pub const $name: &[u8] = concat!($text, "\r\n").as_bytes();)*
    };
}

lines! {
    /// Ends a retrieval's values, a `stats` reply, a dump.
    END = "END";
    /// A storage command stored its item.
    STORED = "STORED";
    /// `add`/`replace`/`append`/`prepend` whose condition did not hold.
    NOT_STORED = "NOT_STORED";
    /// `cas` on an item changed since the client read it.
    EXISTS = "EXISTS";
    /// The key is absent (`delete`, `touch`, `incr`/`decr`, `cas`).
    NOT_FOUND = "NOT_FOUND";
    /// `delete` removed the item.
    DELETED = "DELETED";
    /// `touch` found the item.
    TOUCHED = "TOUCHED";
    /// A command with nothing to report succeeded (`flush_all`, `verbosity`, settings).
    OK = "OK";
    /// `stats reset`.
    RESET = "RESET";
    /// Unknown command or group, or a wrong number of arguments.
    ERROR = "ERROR";
    /// `mn`: the end of a pipeline of quiet meta commands.
    MN = "MN";
    /// A meta miss with no flags to return (`me` of an absent key).
    EN = "EN";

    /// `shutdown` (any mode) while the shutdown command is disabled.
    ERROR_SHUTDOWN_DISABLED = "ERROR: shutdown not enabled";
    /// `lru_crawler enable`: there is no crawler to start.
    ERROR_LRU_CRAWLER_THREAD = "ERROR failed to start lru crawler thread";
    /// `cache_memlimit` below memcached's 8 MB minimum.
    MEMLIMIT_TOO_SMALL = "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m";
    /// `slabs reassign` from a class to itself.
    SLABS_REASSIGN_SAME = "SAME src and dst class are identical";
    /// `slabs reassign` naming a class that does not exist.
    SLABS_REASSIGN_BAD_CLASS = "BADCLASS invalid src or dst class id";

    /// The store has no room for the item, even after eviction.
    SERVER_ERROR_OUT_OF_MEMORY = "SERVER_ERROR out of memory storing object";
    /// `incr`/`decr` (or `ma`) of a value that is not a decimal number.
    CLIENT_ERROR_NON_NUMERIC = "CLIENT_ERROR cannot increment or decrement non-numeric value";
    /// `flush_all` while flushing is disabled (memcached `-F`).
    CLIENT_ERROR_FLUSH_DISABLED = "CLIENT_ERROR flush_all not allowed";
    /// `lru_crawler crawl|metadump|mgdump`: there is no crawler.
    CLIENT_ERROR_LRU_CRAWLER_DISABLED = "CLIENT_ERROR lru crawler disabled";
    /// `shutdown <mode>` with a mode other than `graceful`, shutdown enabled.
    CLIENT_ERROR_INVALID_SHUTDOWN_MODE = "CLIENT_ERROR invalid shutdown mode";
    /// `stats detail` with an unknown subcommand.
    CLIENT_ERROR_STATS_DETAIL_USAGE = "CLIENT_ERROR usage: stats detail on|off|dump";
    /// `stats cachedump` without its two arguments.
    CLIENT_ERROR_BAD_COMMAND_LINE = "CLIENT_ERROR bad command line";
    /// `stats cachedump` of a class id memcached does not have.
    CLIENT_ERROR_ILLEGAL_SLAB_ID = "CLIENT_ERROR Illegal slab id";
    /// Any request but a login before a connection authenticated (memcached `-Y`).
    CLIENT_ERROR_UNAUTHENTICATED = "CLIENT_ERROR unauthenticated";
    /// A login with a wrong user or password.
    CLIENT_ERROR_AUTHENTICATION_FAILURE = "CLIENT_ERROR authentication failure";
    /// A login whose data block is not `<user> <password>`.
    CLIENT_ERROR_BAD_AUTHENTICATION_TOKEN = "CLIENT_ERROR bad authentication token format";
    /// A login whose data block does not end where its length says.
    CLIENT_ERROR_BAD_COMMAND_LINE_TERMINATION = "CLIENT_ERROR bad command line termination";

    /// cellcache's own: `cache_memlimit` above the arena allocated at start.
    CLIENT_ERROR_MEMLIMIT_ABOVE_ARENA =
        "CLIENT_ERROR cannot grow a preallocated arena past memory_limit_bytes";
    /// cellcache's own: a keyed request to a standby cell (not in a ring yet).
    SERVER_ERROR_STANDBY = "SERVER_ERROR standby: this cell is not in a ring yet";
    /// cellcache's own: a `cluster` command other than `invite` to a standby cell.
    SERVER_ERROR_STANDBY_INVITE_ONLY =
        "SERVER_ERROR standby: only `cluster invite <ring-addr> <parent-id>` works";
    /// cellcache's own: the thread that would join the ring could not be started.
    SERVER_ERROR_JOIN_NOT_STARTED = "SERVER_ERROR cannot start the join";
    /// cellcache's own: a standby cell invited twice.
    SERVER_ERROR_ALREADY_JOINING = "SERVER_ERROR already joining or joined";
    /// cellcache's own: `cluster invite` with a parent id that is no cell id.
    CLIENT_ERROR_BAD_CELL_ID = "CLIENT_ERROR bad cell id";

    /// cellcache's own (a ring): no master could be reached within the request timeout;
    /// retryable, unknown outcome.
    SERVER_ERROR_UNAVAILABLE = "SERVER_ERROR cluster: no master available for this key, retry";
    /// cellcache's own (a ring): the master a write was forwarded to was lost, or its link
    /// stalled, before it answered: the write may have been applied or not.
    SERVER_ERROR_MASTER_LOST =
        "SERVER_ERROR cluster: master lost before answering (the write may or may not be applied)";
    /// cellcache's own (a ring): a write not confirmed on its backups.
    SERVER_ERROR_UNREPLICATED =
        "SERVER_ERROR cluster: write not confirmed by its backup (it may or may not be applied)";
    /// cellcache's own (a ring): a cell removed from the ring serves no key any more.
    SERVER_ERROR_FENCED =
        "SERVER_ERROR cluster: this cell was removed from the ring; use another cell";
    /// cellcache's own (a ring): a forwarded request this cell cannot parse.
    SERVER_ERROR_UNPARSABLE_ROUTED = "SERVER_ERROR cluster: unparsable routed request";
    /// cellcache's own (a ring with a secret): `cluster join`/`cluster leave` on the client
    /// port.
    CLIENT_ERROR_NEEDS_SECRET = "CLIENT_ERROR this ring has a cluster secret: join and leave go to the peer port with it (serve --join and ctl with --cluster-secret-file)";
}

/// A key, number or argument the command cannot use (also a parser error).
pub const CLIENT_ERROR_BAD_COMMAND_LINE_FORMAT: &[u8] = ClientError::BadCommandLineFormat.line();
/// A meta flag the command does not take (also a parser error).
pub const CLIENT_ERROR_INVALID_FLAG: &[u8] = ClientError::InvalidFlag.line();
/// The item is larger than `item_size_max` (also a parser error).
pub const SERVER_ERROR_OBJECT_TOO_LARGE: &[u8] = ServerError::ObjectTooLarge.line();

/// Writes `OK <text>`: how cellcache's own `cluster` commands report what they did
/// (memcached's plain `OK` is [`OK`]).
pub fn write_ok_with(out: &mut Vec<u8>, text: &[u8]) {
    out.extend_from_slice(b"OK ");
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_one_line_each_with_crlf() {
        for line in [
            END,
            STORED,
            MN,
            EN,
            MEMLIMIT_TOO_SMALL,
            SERVER_ERROR_STANDBY_INVITE_ONLY,
            CLIENT_ERROR_BAD_COMMAND_LINE_FORMAT,
            SERVER_ERROR_OBJECT_TOO_LARGE,
        ] {
            assert!(line.ends_with(b"\r\n"), "{line:?}");
            assert_eq!(memchr::memchr(b'\n', line), Some(line.len() - 1));
        }
        assert_eq!(NOT_FOUND, b"NOT_FOUND\r\n");
        let mut out = Vec::new();
        write_ok_with(&mut out, b"c3");
        assert_eq!(out, b"OK c3\r\n");
        assert_eq!(
            SERVER_ERROR_OBJECT_TOO_LARGE,
            b"SERVER_ERROR object too large for cache\r\n"
        );
        assert_eq!(CLIENT_ERROR_INVALID_FLAG, b"CLIENT_ERROR invalid flag\r\n");
    }
}
