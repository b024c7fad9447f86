//! Meta commands (`mg`, `ms`, `md`, `ma`, `mn`, `me`): typed flag sets, their
//! parsing from the flag tokens of a request line, and their encoding.
//!
//! Flags are single characters, some followed by a token (`T30`, `Oabc`).
//! Like memcached, a flag is identified by the first byte of its token, a
//! flag may appear once (`CLIENT_ERROR duplicate flag`), and the bytes after
//! a flag that takes no token are ignored (`vx` is `v`). Unlike memcached
//! 1.6, a flag the command does not use is rejected with
//! `CLIENT_ERROR invalid flag` instead of being silently accepted.
//!
//! Return flags (`c f h k l O s t`) are echoed in the reply in the order the
//! request gave them, so [`ReturnFlags`] keeps that order.

use crate::error::ClientError;
use crate::limits::{META_FLAGS_MAX, OPAQUE_BYTES_MAX};
use crate::token::{
    BINARY_KEY_BYTES_MAX, Tokens, base64_decode, parse_i64, parse_u32, parse_u64, write_i64,
    write_u64,
};

/// A meta key as sent: raw, or base64 text when the request had the `b` flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MetaKey<'a> {
    /// The key token exactly as on the wire (base64 text when `base64`).
    pub wire: &'a [u8],
    /// The `b` flag: `wire` is base64 of a binary key.
    pub base64: bool,
}

/// Buffer large enough for any decoded base64 key.
pub type BinaryKeyBuf = [u8; BINARY_KEY_BYTES_MAX];

impl<'a> MetaKey<'a> {
    /// The key the store should use: `wire` itself, or its base64 decoding
    /// written into `buf`. The parser has already checked that decoding
    /// succeeds, so this returns `wire` only for non-base64 keys.
    pub fn binary<'b>(&self, buf: &'b mut BinaryKeyBuf) -> &'b [u8]
    where
        'a: 'b,
    {
        if !self.base64 {
            return self.wire;
        }
        match base64_decode(self.wire, buf) {
            Some(n) => &buf[..n],
            // Unreachable for parsed requests; a hand-built bad key maps to
            // the empty key, which no item can have.
            None => &[],
        }
    }
}

/// A flag whose value the reply echoes, in request order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReturnFlag {
    /// `c`: the item's CAS value.
    Cas,
    /// `f`: the client flags.
    ClientFlags,
    /// `h`: whether the item was hit before (0/1).
    HitBefore,
    /// `k`: the key.
    Key,
    /// `l`: seconds since last access.
    LastAccess,
    /// `O`: the opaque token, copied back.
    Opaque,
    /// `s`: the item size.
    Size,
    /// `t`: remaining TTL in seconds (-1 = never expires).
    Ttl,
}

impl ReturnFlag {
    /// The flag character.
    pub const fn letter(self) -> u8 {
        match self {
            ReturnFlag::Cas => b'c',
            ReturnFlag::ClientFlags => b'f',
            ReturnFlag::HitBefore => b'h',
            ReturnFlag::Key => b'k',
            ReturnFlag::LastAccess => b'l',
            ReturnFlag::Opaque => b'O',
            ReturnFlag::Size => b's',
            ReturnFlag::Ttl => b't',
        }
    }

    /// The flag for a character, if it is a return flag.
    pub const fn from_letter(letter: u8) -> Option<Self> {
        Some(match letter {
            b'c' => ReturnFlag::Cas,
            b'f' => ReturnFlag::ClientFlags,
            b'h' => ReturnFlag::HitBefore,
            b'k' => ReturnFlag::Key,
            b'l' => ReturnFlag::LastAccess,
            b'O' => ReturnFlag::Opaque,
            b's' => ReturnFlag::Size,
            b't' => ReturnFlag::Ttl,
            _ => return None,
        })
    }
}

/// Number of distinct [`ReturnFlag`]s.
const RETURN_FLAGS_MAX: usize = 8;

/// The return flags of a request, in request order, with the opaque token.
/// Inline (no allocation); each flag appears at most once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct ReturnFlags<'a> {
    order: [Option<ReturnFlag>; RETURN_FLAGS_MAX],
    len: u8,
    opaque: Option<&'a [u8]>,
}

impl<'a> ReturnFlags<'a> {
    /// Empty set.
    pub const fn new() -> Self {
        Self {
            order: [None; RETURN_FLAGS_MAX],
            len: 0,
            opaque: None,
        }
    }

    /// Adds `flag` at the end unless present; use [`Self::push_opaque`] for `O`.
    /// Returns false when the flag was already present (or is `Opaque`).
    pub fn push(&mut self, flag: ReturnFlag) -> bool {
        if flag == ReturnFlag::Opaque || self.contains(flag) {
            return false;
        }
        self.order[usize::from(self.len)] = Some(flag);
        self.len += 1;
        true
    }

    /// Adds the opaque flag with its token (at most 32 bytes, no spaces).
    /// Returns false when an opaque was already present.
    pub fn push_opaque(&mut self, token: &'a [u8]) -> bool {
        if self.opaque.is_some() {
            return false;
        }
        self.order[usize::from(self.len)] = Some(ReturnFlag::Opaque);
        self.len += 1;
        self.opaque = Some(token);
        true
    }

    /// Whether `flag` was requested.
    pub fn contains(&self, flag: ReturnFlag) -> bool {
        self.iter().any(|f| f == flag)
    }

    /// The opaque token, if `O` was given.
    pub fn opaque(&self) -> Option<&'a [u8]> {
        self.opaque
    }

    /// The flags in request order.
    pub fn iter(&self) -> impl Iterator<Item = ReturnFlag> + '_ {
        self.order[..usize::from(self.len)]
            .iter()
            .flatten()
            .copied()
    }

    /// Number of flags.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether no flag was requested.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn encode(&self, out: &mut Vec<u8>) {
        for flag in self.iter() {
            out.push(b' ');
            out.push(flag.letter());
            if flag == ReturnFlag::Opaque {
                out.extend_from_slice(self.opaque.unwrap_or_default());
            }
        }
    }
}

/// `mg` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct MetaGetFlags<'a> {
    /// `c f h k l O s t`, in request order.
    pub returns: ReturnFlags<'a>,
    /// `v`: return the value (reply `VA` instead of `HD`).
    pub value: bool,
    /// `q`: suppress `EN` on a miss.
    pub quiet: bool,
    /// `u`: do not bump the item in the LRU nor update its access time.
    pub no_lru_bump: bool,
    /// `E(token)`: CAS value to give the item if this command modifies it.
    pub new_cas: Option<u64>,
    /// `N(ttl)`: vivify on miss, creating an empty item with this TTL.
    pub vivify_ttl: Option<i64>,
    /// `R(ttl)`: win the recache right if the remaining TTL is below this.
    pub recache_ttl: Option<i64>,
    /// `T(ttl)`: update the remaining TTL (touch).
    pub new_ttl: Option<i64>,
    /// `Y` (cellcache extension, not in memcached): an eventual read; in a ring, a cell
    /// holding a backup copy of the key may answer from it instead of asking the master.
    pub eventual: bool,
}

/// `ms` mode (`M` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum SetMode {
    /// `MS`, the default: store.
    #[default]
    Set,
    /// `ME`: add (store only if absent).
    Add,
    /// `MA`: append to an existing value.
    Append,
    /// `MP`: prepend to an existing value.
    Prepend,
    /// `MR`: replace (store only if present).
    Replace,
}

impl SetMode {
    const fn letter(self) -> u8 {
        match self {
            SetMode::Set => b'S',
            SetMode::Add => b'E',
            SetMode::Append => b'A',
            SetMode::Prepend => b'P',
            SetMode::Replace => b'R',
        }
    }
}

/// `ms` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct MetaSetFlags<'a> {
    /// `c k O s`, in request order.
    pub returns: ReturnFlags<'a>,
    /// `q`: suppress `HD`.
    pub quiet: bool,
    /// `C(token)`: store only if the item's CAS equals this.
    pub compare_cas: Option<u64>,
    /// `E(token)`: CAS value to give the stored item.
    pub new_cas: Option<u64>,
    /// `F(token)`: client flags (0 when absent).
    pub client_flags: Option<u32>,
    /// `I`: invalidate: with `C`, a CAS older than the item's marks it stale.
    pub invalidate: bool,
    /// `T(ttl)`: the item's TTL (0 = never expires when absent).
    pub ttl: Option<i64>,
    /// `M(mode)`.
    pub mode: SetMode,
    /// `N(ttl)`: in append/prepend mode, create the item on a miss with this TTL.
    pub vivify_ttl: Option<i64>,
}

/// `md` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct MetaDeleteFlags<'a> {
    /// `k O`, in request order.
    pub returns: ReturnFlags<'a>,
    /// `q`: suppress `HD`.
    pub quiet: bool,
    /// `C(token)`: delete only if the item's CAS equals this.
    pub compare_cas: Option<u64>,
    /// `E(token)`: CAS value to give the item when invalidating.
    pub new_cas: Option<u64>,
    /// `I`: mark stale (and bump CAS) instead of removing.
    pub invalidate: bool,
    /// `T(ttl)`: with `I`, the stale item's new TTL.
    pub new_ttl: Option<i64>,
    /// `x`: remove the value but keep the item.
    pub remove_value: bool,
}

/// `ma` mode (`M` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum ArithmeticMode {
    /// `MI` or `M+`, the default.
    #[default]
    Increment,
    /// `MD` or `M-`: decrement, stopping at 0.
    Decrement,
}

/// `ma` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct MetaArithmeticFlags<'a> {
    /// `c t k O`, in request order.
    pub returns: ReturnFlags<'a>,
    /// `v`: return the new value (reply `VA`).
    pub value: bool,
    /// `q`: suppress `HD`.
    pub quiet: bool,
    /// `C(token)`: apply only if the item's CAS equals this.
    pub compare_cas: Option<u64>,
    /// `E(token)`: CAS value to give the item.
    pub new_cas: Option<u64>,
    /// `N(ttl)`: create the item on a miss with this TTL.
    pub vivify_ttl: Option<i64>,
    /// `J(n)`: initial value when created on a miss (default 0).
    pub initial: Option<u64>,
    /// `D(n)`: delta (default 1); see [`Self::delta_or_default`].
    pub delta: Option<u64>,
    /// `T(ttl)`: update the TTL on success.
    pub new_ttl: Option<i64>,
    /// `M(mode)`.
    pub mode: ArithmeticMode,
}

impl MetaArithmeticFlags<'_> {
    /// The delta to apply: `D` or 1.
    pub fn delta_or_default(&self) -> u64 {
        self.delta.unwrap_or(1)
    }

    /// The value to create on a miss: `J` or 0.
    pub fn initial_or_default(&self) -> u64 {
        self.initial.unwrap_or(0)
    }
}

/// Which meta command a flag set belongs to; decides which flags are legal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetaCommand {
    Get,
    Set,
    Delete,
    Arithmetic,
}

/// Return flags each command accepts.
fn accepts_return(command: MetaCommand, flag: ReturnFlag) -> bool {
    use ReturnFlag as R;
    match command {
        MetaCommand::Get => true,
        MetaCommand::Set => matches!(flag, R::Cas | R::Key | R::Opaque | R::Size),
        MetaCommand::Delete => matches!(flag, R::Key | R::Opaque),
        MetaCommand::Arithmetic => matches!(flag, R::Cas | R::Ttl | R::Key | R::Opaque),
    }
}

/// Everything any meta command can say, before per-command assembly.
#[derive(Default)]
struct RawFlags<'a> {
    returns: ReturnFlags<'a>,
    base64: bool,
    value: bool,
    quiet: bool,
    no_lru_bump: bool,
    invalidate: bool,
    remove_value: bool,
    compare_cas: Option<u64>,
    new_cas: Option<u64>,
    client_flags: Option<u32>,
    vivify_ttl: Option<i64>,
    recache_ttl: Option<i64>,
    ttl: Option<i64>,
    initial: Option<u64>,
    delta: Option<u64>,
    mode: Option<u8>,
    eventual: bool,
}

fn parse_raw<'a>(
    command: MetaCommand,
    flags: Tokens<'a>,
    key_token: &'a [u8],
) -> Result<RawFlags<'a>, ClientError> {
    // memcached checks the flag count before any flag, so a too-long line
    // reports that even when an earlier flag is also bad.
    let all = flags.clone();
    let too_many = || all.clone().count() > META_FLAGS_MAX;
    match parse_tokens(command, flags, key_token) {
        Err(_) if too_many() => Err(ClientError::TooManyFlags),
        result => result,
    }
}

fn parse_tokens<'a>(
    command: MetaCommand,
    flags: Tokens<'a>,
    key_token: &'a [u8],
) -> Result<RawFlags<'a>, ClientError> {
    let mut raw = RawFlags::default();
    let mut seen: u128 = 0;
    for (index, token) in flags.enumerate() {
        if index == META_FLAGS_MAX {
            return Err(ClientError::TooManyFlags);
        }
        let letter = token[0];
        if letter >= 128 {
            return Err(ClientError::InvalidFlag);
        }
        if seen & (1u128 << letter) != 0 {
            return Err(ClientError::DuplicateFlag);
        }
        seen |= 1u128 << letter;
        let arg = &token[1..];
        let signed = || parse_i64(arg).ok_or(ClientError::BadToken);
        let unsigned = || parse_u64(arg).ok_or(ClientError::BadToken);
        use MetaCommand as C;
        match (letter, command) {
            (b'O', _) => {
                if arg.len() > OPAQUE_BYTES_MAX {
                    return Err(ClientError::OpaqueTooLong);
                }
                raw.returns.push_opaque(arg);
            }
            (b'b', _) => raw.base64 = true,
            (b'q', _) => raw.quiet = true,
            (b'v', C::Get | C::Arithmetic) => raw.value = true,
            (b'u', C::Get) => raw.no_lru_bump = true,
            (b'Y', C::Get) => raw.eventual = true,
            (b'I', C::Set | C::Delete) => raw.invalidate = true,
            (b'x', C::Delete) => raw.remove_value = true,
            (b'C', C::Set | C::Delete | C::Arithmetic) => raw.compare_cas = Some(unsigned()?),
            (b'E', _) => raw.new_cas = Some(unsigned()?),
            (b'F', C::Set) => {
                raw.client_flags = Some(parse_u32(arg).ok_or(ClientError::BadToken)?);
            }
            (b'N', C::Get | C::Set | C::Arithmetic) => raw.vivify_ttl = Some(signed()?),
            (b'R', C::Get) => raw.recache_ttl = Some(signed()?),
            (b'T', _) => raw.ttl = Some(signed()?),
            (b'J', C::Arithmetic) => {
                raw.initial = Some(parse_u64(arg).ok_or(ClientError::InvalidInitialToken)?);
            }
            (b'D', C::Arithmetic) => {
                raw.delta = Some(parse_u64(arg).ok_or(ClientError::InvalidDeltaToken)?);
            }
            (b'M', C::Set | C::Arithmetic) => {
                let [mode] = arg else {
                    return Err(ClientError::ModeTokenLength);
                };
                raw.mode = Some(*mode);
            }
            _ => match ReturnFlag::from_letter(letter) {
                Some(flag) if accepts_return(command, flag) => {
                    raw.returns.push(flag);
                }
                _ => return Err(ClientError::InvalidFlag),
            },
        }
    }
    if raw.base64 {
        let mut buf = [0u8; BINARY_KEY_BYTES_MAX];
        if base64_decode(key_token, &mut buf).is_none() {
            return Err(ClientError::KeyDecode);
        }
    }
    Ok(raw)
}

/// Parses `mg` flag tokens; `key_token` is needed to validate `b` keys.
pub(crate) fn parse_get_flags<'a>(
    flags: Tokens<'a>,
    key_token: &'a [u8],
) -> Result<(MetaKey<'a>, MetaGetFlags<'a>), ClientError> {
    let raw = parse_raw(MetaCommand::Get, flags, key_token)?;
    let key = MetaKey {
        wire: key_token,
        base64: raw.base64,
    };
    Ok((
        key,
        MetaGetFlags {
            returns: raw.returns,
            value: raw.value,
            quiet: raw.quiet,
            no_lru_bump: raw.no_lru_bump,
            new_cas: raw.new_cas,
            vivify_ttl: raw.vivify_ttl,
            recache_ttl: raw.recache_ttl,
            new_ttl: raw.ttl,
            eventual: raw.eventual,
        },
    ))
}

/// Parses `ms` flag tokens.
pub(crate) fn parse_set_flags<'a>(
    flags: Tokens<'a>,
    key_token: &'a [u8],
) -> Result<(MetaKey<'a>, MetaSetFlags<'a>), ClientError> {
    let raw = parse_raw(MetaCommand::Set, flags, key_token)?;
    let mode = match raw.mode {
        // Upper case only: memcached 1.6.18 answers `Ms` with "invalid mode for ms M token".
        None | Some(b'S') => SetMode::Set,
        Some(b'E') => SetMode::Add,
        Some(b'A') => SetMode::Append,
        Some(b'P') => SetMode::Prepend,
        Some(b'R') => SetMode::Replace,
        Some(_) => return Err(ClientError::InvalidSetMode),
    };
    Ok((
        MetaKey {
            wire: key_token,
            base64: raw.base64,
        },
        MetaSetFlags {
            returns: raw.returns,
            quiet: raw.quiet,
            compare_cas: raw.compare_cas,
            new_cas: raw.new_cas,
            client_flags: raw.client_flags,
            invalidate: raw.invalidate,
            ttl: raw.ttl,
            mode,
            vivify_ttl: raw.vivify_ttl,
        },
    ))
}

/// Parses `md` flag tokens.
pub(crate) fn parse_delete_flags<'a>(
    flags: Tokens<'a>,
    key_token: &'a [u8],
) -> Result<(MetaKey<'a>, MetaDeleteFlags<'a>), ClientError> {
    let raw = parse_raw(MetaCommand::Delete, flags, key_token)?;
    Ok((
        MetaKey {
            wire: key_token,
            base64: raw.base64,
        },
        MetaDeleteFlags {
            returns: raw.returns,
            quiet: raw.quiet,
            compare_cas: raw.compare_cas,
            new_cas: raw.new_cas,
            invalidate: raw.invalidate,
            new_ttl: raw.ttl,
            remove_value: raw.remove_value,
        },
    ))
}

/// Parses `ma` flag tokens.
pub(crate) fn parse_arithmetic_flags<'a>(
    flags: Tokens<'a>,
    key_token: &'a [u8],
) -> Result<(MetaKey<'a>, MetaArithmeticFlags<'a>), ClientError> {
    let raw = parse_raw(MetaCommand::Arithmetic, flags, key_token)?;
    let mode = match raw.mode {
        // As memcached 1.6.18: `Mi`/`Md` are "invalid mode for ma M token".
        None | Some(b'I' | b'+') => ArithmeticMode::Increment,
        Some(b'D' | b'-') => ArithmeticMode::Decrement,
        Some(_) => return Err(ClientError::InvalidArithmeticMode),
    };
    Ok((
        MetaKey {
            wire: key_token,
            base64: raw.base64,
        },
        MetaArithmeticFlags {
            returns: raw.returns,
            value: raw.value,
            quiet: raw.quiet,
            compare_cas: raw.compare_cas,
            new_cas: raw.new_cas,
            vivify_ttl: raw.vivify_ttl,
            initial: raw.initial,
            delta: raw.delta,
            new_ttl: raw.ttl,
            mode,
        },
    ))
}

/// Parses the flags of `me`: like memcached 1.6, only a first flag token of
/// exactly `b` means anything (base64 key); other tokens are ignored.
pub(crate) fn parse_debug_key<'a>(
    mut flags: Tokens<'a>,
    key_token: &'a [u8],
) -> Result<MetaKey<'a>, ClientError> {
    let base64 = flags.next() == Some(b"b");
    if base64 {
        let mut buf = [0u8; BINARY_KEY_BYTES_MAX];
        if base64_decode(key_token, &mut buf).is_none() {
            return Err(ClientError::BadCommandLineFormat);
        }
    }
    Ok(MetaKey {
        wire: key_token,
        base64,
    })
}

fn flag(out: &mut Vec<u8>, letter: u8, on: bool) {
    if on {
        out.push(b' ');
        out.push(letter);
    }
}

fn flag_u64(out: &mut Vec<u8>, letter: u8, value: Option<u64>) {
    if let Some(v) = value {
        out.push(b' ');
        out.push(letter);
        write_u64(out, v);
    }
}

fn flag_i64(out: &mut Vec<u8>, letter: u8, value: Option<i64>) {
    if let Some(v) = value {
        out.push(b' ');
        out.push(letter);
        write_i64(out, v);
    }
}

impl MetaGetFlags<'_> {
    /// Appends the flag tokens, each preceded by a space.
    pub fn encode(&self, base64: bool, out: &mut Vec<u8>) {
        self.returns.encode(out);
        flag(out, b'b', base64);
        flag(out, b'v', self.value);
        flag(out, b'q', self.quiet);
        flag(out, b'u', self.no_lru_bump);
        flag_u64(out, b'E', self.new_cas);
        flag_i64(out, b'N', self.vivify_ttl);
        flag_i64(out, b'R', self.recache_ttl);
        flag_i64(out, b'T', self.new_ttl);
        flag(out, b'Y', self.eventual);
    }
}

impl MetaSetFlags<'_> {
    /// Appends the flag tokens, each preceded by a space.
    pub fn encode(&self, base64: bool, out: &mut Vec<u8>) {
        self.returns.encode(out);
        flag(out, b'b', base64);
        flag(out, b'q', self.quiet);
        flag(out, b'I', self.invalidate);
        flag_u64(out, b'C', self.compare_cas);
        flag_u64(out, b'E', self.new_cas);
        flag_u64(out, b'F', self.client_flags.map(u64::from));
        flag_i64(out, b'T', self.ttl);
        if self.mode != SetMode::Set {
            out.extend_from_slice(b" M");
            out.push(self.mode.letter());
        }
        flag_i64(out, b'N', self.vivify_ttl);
    }
}

impl MetaDeleteFlags<'_> {
    /// Appends the flag tokens, each preceded by a space.
    pub fn encode(&self, base64: bool, out: &mut Vec<u8>) {
        self.returns.encode(out);
        flag(out, b'b', base64);
        flag(out, b'q', self.quiet);
        flag(out, b'I', self.invalidate);
        flag(out, b'x', self.remove_value);
        flag_u64(out, b'C', self.compare_cas);
        flag_u64(out, b'E', self.new_cas);
        flag_i64(out, b'T', self.new_ttl);
    }
}

impl MetaArithmeticFlags<'_> {
    /// Appends the flag tokens, each preceded by a space.
    pub fn encode(&self, base64: bool, out: &mut Vec<u8>) {
        self.returns.encode(out);
        flag(out, b'b', base64);
        flag(out, b'v', self.value);
        flag(out, b'q', self.quiet);
        flag_u64(out, b'C', self.compare_cas);
        flag_u64(out, b'E', self.new_cas);
        flag_i64(out, b'N', self.vivify_ttl);
        flag_u64(out, b'J', self.initial);
        flag_u64(out, b'D', self.delta);
        flag_i64(out, b'T', self.new_ttl);
        if self.mode == ArithmeticMode::Decrement {
            out.extend_from_slice(b" MD");
        }
    }
}
