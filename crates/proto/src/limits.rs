//! Protocol limits: every length the parser reads from the wire is bounded by
//! one of these before it is trusted.
//!
//! The node's TOML config embeds [`Limits`] (serde `Deserialize` + `Default`),
//! so each value is configurable; the defaults match memcached where memcached
//! has a limit and are documented on each field where it does not.

use serde::Deserialize;

/// Longest key memcached accepts (protocol.txt "Keys").
pub const KEY_BYTES_MAX_DEFAULT: usize = cellcache_keyspace::KEY_BYTES_MAX;
/// memcached's default `item_size_max` (`-I 1m`), the default longest value.
pub const ITEM_SIZE_MAX_DEFAULT: usize = 1024 * 1024;
/// Bytes memcached 1.6 counts for an item beyond its key and value (its item header with the
/// CAS field, the key's NUL, the value's `\r\n`): a storage request is too large when
/// `key + value + 59` (+ [`ITEM_FLAGS_BYTES`] with non-zero client flags) exceeds
/// `item_size_max`. Measured on memcached 1.6.18; `cellcache_store::ITEM_OVERHEAD_BYTES` is
/// the same number (the node checks they agree).
pub const ITEM_OVERHEAD_BYTES: usize = 59;
/// Extra bytes memcached counts for non-zero client flags.
pub const ITEM_FLAGS_BYTES: usize = 4;
/// Bytes of [`ITEM_OVERHEAD_BYTES`] that hold the CAS; memcached `-C` drops them.
pub const ITEM_CAS_BYTES: usize = 8;
/// Keys executed per batch of a `get`/`gets`/`gat`/`gats` line (a line may
/// hold any number of keys, as in memcached; see [`crate::Parsed::Partial`]).
pub const KEYS_PER_GET_MAX_DEFAULT: usize = 256;
/// Longest command line, terminator included (a retrieval line may be longer:
/// it is taken in batches of this window). 64 KiB holds a batch of
/// [`KEYS_PER_GET_MAX_DEFAULT`] maximal keys (256 × 251 + command word).
pub const LINE_BYTES_MAX_DEFAULT: usize = 64 * 1024;
/// memcached rejects opaque (`O`) tokens longer than 32 bytes.
pub const OPAQUE_BYTES_MAX: usize = 32;
/// memcached rejects meta commands with more than this many flag tokens
/// ("CLIENT_ERROR options flags are too long").
pub const META_FLAGS_MAX: usize = 20;

/// Bounds applied while parsing requests (server side) and replies (client side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Longest key, in bytes (default 250, as memcached). For meta commands
    /// with the `b` flag this bounds the base64 text as sent; a base64 key
    /// also never decodes to more than 187 bytes (250 base64 characters),
    /// whatever this limit says.
    pub key_bytes_max: usize,
    /// Longest command or reply line in bytes, `\r\n` included (default 64 KiB).
    /// A longer command line closes the connection without a reply, as
    /// memcached does (the parser cannot find the next frame) — except a
    /// retrieval line, whose keys are taken in batches within this window, so
    /// neither the line nor all its values are ever held at once.
    pub line_bytes_max: usize,
    /// Largest item, counted as memcached counts it (`item_size_max`, `-I`,
    /// default 1 MiB; see [`Limits::item_fits`]). A storage request whose item
    /// does not fit gets `SERVER_ERROR object too large for cache` and its data
    /// is swallowed. Replies are bounded by [`Limits::value_bytes_max`].
    pub item_size_max: usize,
    /// Items carry a CAS in memcached's accounting (default true; memcached
    /// `-C` turns it off and items count [`ITEM_CAS_BYTES`] less).
    pub cas_enabled: bool,
    /// Most keys per batch of a multi-key retrieval (default 256): a line
    /// with more is answered batch by batch, with `END` after the last.
    pub keys_per_get_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            key_bytes_max: KEY_BYTES_MAX_DEFAULT,
            line_bytes_max: LINE_BYTES_MAX_DEFAULT,
            item_size_max: ITEM_SIZE_MAX_DEFAULT,
            cas_enabled: true,
            keys_per_get_max: KEYS_PER_GET_MAX_DEFAULT,
        }
    }
}

/// A [`Limits`] that cannot work; returned by [`Limits::validate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    /// A key must be at least one byte.
    #[error("key_bytes_max must be at least 1")]
    KeyZero,
    /// Every limit must leave room for at least one request.
    #[error("keys_per_get_max must be at least 1")]
    KeysPerGetZero,
    /// A line must hold the longest single-key command.
    #[error("line_bytes_max ({line}) must hold a single-key command line ({needed} bytes)")]
    LineTooShort {
        /// Configured line limit.
        line: usize,
        /// Smallest acceptable line limit for the configured key limit.
        needed: usize,
    },
}

/// Room a single-key command line needs beyond the key: the longest command
/// word with its numeric arguments (`cas <key> <u32> <i64> <u64> <u64> noreply\r\n`).
const LINE_OVERHEAD_BYTES: usize = 128;

impl Limits {
    /// Checks that the limits are usable together; the node calls this at
    /// start and refuses to run with a bad configuration.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.key_bytes_max == 0 {
            return Err(LimitsError::KeyZero);
        }
        if self.keys_per_get_max == 0 {
            return Err(LimitsError::KeysPerGetZero);
        }
        let needed = self.key_bytes_max + LINE_OVERHEAD_BYTES;
        if self.line_bytes_max < needed {
            return Err(LimitsError::LineTooShort {
                line: self.line_bytes_max,
                needed,
            });
        }
        Ok(())
    }

    /// Whether an item with this key length, value length and client flags is
    /// within `item_size_max`, as memcached 1.6 decides it:
    /// `key + value + 59 (+ 4 when flags != 0) <= item_size_max`.
    /// `key + value + 59 (+ 4 when flags != 0, - 8 without CAS) <= item_size_max`.
    pub fn item_fits(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        key_len
            .saturating_add(value_len)
            .saturating_add(self.item_overhead_bytes(flags))
            <= self.item_size_max
    }

    fn item_overhead_bytes(&self, flags: u32) -> usize {
        let flags_bytes = if flags != 0 { ITEM_FLAGS_BYTES } else { 0 };
        let cas_saved = if self.cas_enabled { 0 } else { ITEM_CAS_BYTES };
        ITEM_OVERHEAD_BYTES + flags_bytes - cas_saved
    }

    /// Bounds for a client reading replies: lines up to `line_bytes_max`
    /// bytes (`\r\n` included), values up to `value_bytes_max` bytes (what
    /// [`Limits::value_bytes_max`] then answers); the request-side fields are
    /// the defaults.
    pub fn for_replies(line_bytes_max: usize, value_bytes_max: usize) -> Self {
        let defaults = Self::default();
        Self {
            line_bytes_max,
            item_size_max: value_bytes_max.saturating_add(defaults.item_overhead_bytes(0) + 1),
            ..defaults
        }
    }

    /// Largest value any item can hold (a 1-byte key, flags 0); bounds the
    /// values of replies.
    pub fn value_bytes_max(&self) -> usize {
        self.item_size_max
            .saturating_sub(self.item_overhead_bytes(0) + 1)
    }

    /// Largest frame (line plus data block) a request can occupy; the
    /// connection's read buffer must be able to hold this many bytes.
    pub fn frame_bytes_max(&self) -> usize {
        self.line_bytes_max + self.value_bytes_max() + 2
    }
}

const _: () = assert!(
    KEYS_PER_GET_MAX_DEFAULT * (KEY_BYTES_MAX_DEFAULT + 1) + 8 <= LINE_BYTES_MAX_DEFAULT,
    "the default line limit must hold a batch of maximal default keys"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_memcached() {
        let limits = Limits::default();
        assert_eq!(limits.validate(), Ok(()));
        assert_eq!(limits.key_bytes_max, 250);
        assert_eq!(limits.item_size_max, 1 << 20);
        // memcached 1.6.18 -I 1m: largest value 1 048 516 with a 1-byte key, 1 048 267
        // with a 250-byte key, 4 less with non-zero flags.
        assert_eq!(limits.value_bytes_max(), 1_048_516);
        assert!(limits.item_fits(1, 1_048_516, 0));
        assert!(!limits.item_fits(1, 1_048_517, 0));
        assert!(limits.item_fits(250, 1_048_267, 0));
        assert!(!limits.item_fits(250, 1_048_268, 0));
        assert!(limits.item_fits(1, 1_048_512, 1));
        assert!(!limits.item_fits(1, 1_048_513, 1));
        assert!(!limits.item_fits(1, usize::MAX, 0));
    }

    #[test]
    fn reply_limits_bound_values_exactly() {
        let limits = Limits::for_replies(4096, 128 << 20);
        assert_eq!(limits.line_bytes_max, 4096);
        assert_eq!(limits.value_bytes_max(), 128 << 20);
        assert_eq!(Limits::for_replies(64, 0).value_bytes_max(), 0);
        assert_eq!(
            Limits::for_replies(64, usize::MAX).value_bytes_max(),
            usize::MAX - ITEM_OVERHEAD_BYTES - 1
        );
    }

    #[test]
    fn config_overrides_some_fields_and_defaults_the_rest() {
        let limits: Limits =
            serde_json::from_str(r#"{"key_bytes_max": 100, "keys_per_get_max": 8}"#)
                .expect("valid limits config");
        assert_eq!(limits.key_bytes_max, 100);
        assert_eq!(limits.keys_per_get_max, 8);
        assert_eq!(limits.item_size_max, ITEM_SIZE_MAX_DEFAULT);
        assert!(serde_json::from_str::<Limits>(r#"{"key_bytes": 1}"#).is_err());
    }

    #[test]
    fn validate_rejects_unusable_limits() {
        let zero_key = Limits {
            key_bytes_max: 0,
            ..Limits::default()
        };
        assert_eq!(zero_key.validate(), Err(LimitsError::KeyZero));
        let short_line = Limits {
            line_bytes_max: 100,
            ..Limits::default()
        };
        assert!(matches!(
            short_line.validate(),
            Err(LimitsError::LineTooShort { .. })
        ));
        let no_keys = Limits {
            keys_per_get_max: 0,
            ..Limits::default()
        };
        assert_eq!(no_keys.validate(), Err(LimitsError::KeysPerGetZero));
    }
}
